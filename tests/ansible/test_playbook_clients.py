"""Every client command a playbook runs against a server is one tests/playbook_clients.py renders.

So the contract test (tests/sglang/test_client_requests.py: each request through SGLang's own
request objects and the plugin's per-request check) and the GPU test bed's production-path run
(tests/gpu_sglang/test_production_path.py) cover a new client call as soon as a task adds one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests import playbook_clients as pc

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("k26_client.py", "k26_gateway.py", "jit_warmup")


def tasks_in(items):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks_in(task.get(key))


def command_text(task: dict) -> str:
    """What a task runs as a command: a script's cmd or a command's argv (not a template's
    `validate:` check or a file copied to the host)."""
    if "ansible.builtin.script" in task:
        return str(task["ansible.builtin.script"].get("cmd", ""))
    if "ansible.builtin.command" in task:
        module = task["ansible.builtin.command"]
        return " ".join(map(str, module.get("argv", []))) if isinstance(module, dict) else str(module)
    return ""


def client_tasks() -> set[tuple[str, str]]:
    found = set()
    for path in sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/*.yml"),
                        *ROOT.glob("playbooks/tasks/*.yml")]):
        data = yaml.safe_load(path.read_text())
        plays = data if isinstance(data, list) else []
        items = [t for play in plays for t in (play.get("tasks") or [play])] if "playbooks/" in str(path) else plays
        for task in tasks_in(items):
            if any(c in command_text(task) for c in CLIENTS):
                found.add((str(path.relative_to(ROOT)), task["name"]))
    return found


def test_every_client_command_of_the_playbooks_is_rendered_by_the_shared_list():
    listed = {(rel, name) for _, rel, name in pc.ALL_TASKS}
    found = client_tasks()
    assert found, "no client command found: the scan is broken"
    assert found - listed == set(), "a task runs a client that tests/playbook_clients.py does not list"
    assert listed - found == set(), "tests/playbook_clients.py lists a task that no longer runs a client"


@pytest.mark.parametrize("algorithm", ["NONE", "DFLASH", "DDTREE"])
def test_each_servers_commands_render_from_the_task_files(tmp_path, algorithm):
    site = pc.Site(port=31000, config_file=str(tmp_path / "k26-ddtree.yaml"), served_model_name="kimi-k2.6")
    calls = pc.server_calls(site, algorithm)
    modes = [c.argv[2] for c in calls]
    assert modes == ["get", "smoke", "validate", "load", "load"]
    assert all(c.argv[1] == str(pc.CLIENT) and c.env == {"K26_CONFIG_FILE": site.config_file} for c in calls)
    # the NONE reference alone is asked for its top log-probs (validate.yml's last argument)
    assert calls[2].argv[-1] == ("5" if algorithm == "NONE" else "0")
