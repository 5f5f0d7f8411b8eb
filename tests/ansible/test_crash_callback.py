"""The crash harness's callback (tests/infra/crash/callback_plugins/k26_crash.py) on a local play: it kills the run
where it is told - at a task start, or in the middle of a looped task after its N-th item (issue 48) - and only
there. The sandbox's crash tests rely on it; here a play on localhost shows what it does, in seconds."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from .conftest import BIN, ROOT, ansible_env

PLAY = """
- name: Count
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Before the loop
      ansible.builtin.shell: echo before >> {out}
    - name: Write each item
      ansible.builtin.shell: echo {{{{ item }}}} >> {out}
      loop: [one, two, three, four]
    - name: After the loop
      ansible.builtin.shell: echo after >> {out}
"""


def crash_run(tmp_path, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out.txt"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY.format(out=out))
    full = {**ansible_env(tmp_path), "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "tests/infra/crash/callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "k26_crash", **env}
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), "-e",
                           f"ansible_python_interpreter={sys.executable}"], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    return done, out.read_text().split() if out.exists() else []


@pytest.mark.parametrize("item,written", [(1, ["before", "one"]), (3, ["before", "one", "two", "three"])])
def test_a_looped_task_is_killed_after_its_nth_item(tmp_path, item, written):
    done, lines = crash_run(tmp_path, K26_CRASH_AT_NAME="Write each item", K26_CRASH_AT_ITEM=str(item))
    assert done.returncode == -signal.SIGKILL, done.stdout[-2000:]
    assert lines == written
    assert f"k26_crash: killed after item {item} of task start 2: Write each item" in done.stdout


def test_a_task_start_kill_and_an_item_past_the_loop(tmp_path):
    done, lines = crash_run(tmp_path / "start", K26_CRASH_AT="2")
    assert done.returncode == -signal.SIGKILL and lines == ["before"]
    # an item the loop never reaches kills nothing: the run ends whole
    done, lines = crash_run(tmp_path / "past", K26_CRASH_AT_NAME="Write each item", K26_CRASH_AT_ITEM="9")
    assert done.returncode == 0 and lines == ["before", "one", "two", "three", "four", "after"], done.stdout[-2000:]
