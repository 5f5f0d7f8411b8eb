"""Where a rollback puts the env files back (issue 48): where the restored unit reads them.

A deploy that moves k26_config_dir (`--folders`) and fails restores the unit saved before it, which reads its env
files from the old folder. roles/rollback/vars/main.yml's `_rollback_env_dir` reads that folder off the saved
unit's `EnvironmentFile=` line; these tests feed it units rendered by the service role itself."""

from __future__ import annotations

import json
from pathlib import Path

from tests.ansible.conftest import BIN, ROOT, run
from tests.ansible.test_static import render

PLAY = """---
- name: Read the rollback role's env folder off a saved unit
  hosts: localhost
  gather_facts: false
  connection: local
  vars_files: ["{root}/roles/rollback/vars/main.yml"]
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
    k26_config_dir: /etc/k26-now
  tasks:
    - name: Read the saved unit
      ansible.builtin.slurp:
        src: "{unit}"
      register: __rollback_saved_unit
    - name: Write the folder out
      ansible.builtin.copy:
        content: "{{{{ _rollback_env_dir | to_json }}}}"
        dest: "{out}"
        mode: "0600"
"""


def env_dir(unit_text: str, tmp: Path) -> str:
    """`_rollback_env_dir` for a saved unit holding UNIT_TEXT (this play's k26_config_dir is /etc/k26-now)."""
    unit, out, play = tmp / "saved.service", tmp / "env_dir.json", tmp / "play.yml"
    unit.write_text(unit_text)
    play.write_text(PLAY.format(root=ROOT, unit=unit, out=out))
    r = run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play)], tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_unit_rendered_for_another_folder_restores_into_that_folder(tmp_path, vault_pass):
    unit = render("production", tmp_path, vault_pass, "-e", "k26_config_dir=/etc/k26-before")["k26-gpu-01.service"]
    assert "EnvironmentFile=-/etc/k26-before/gpu-host.env" in unit    # the optional file's line comes first
    assert env_dir(unit, tmp_path) == "/etc/k26-before"


def test_the_default_folder_unit_restores_into_the_default_folder(tmp_path, vault_pass):
    unit = render("production", tmp_path, vault_pass)["k26-gpu-01.service"]
    assert env_dir(unit, tmp_path) == "/etc/k26"


def test_a_unit_without_the_env_line_falls_back_to_the_configured_folder(tmp_path):
    # only the optional GPU env line: it names a folder too, but not the env file the unit needs
    unit = "[Service]\nEnvironmentFile=-/etc/elsewhere/gpu-host.env\nExecStart=/bin/true\n"
    assert env_dir(unit, tmp_path) == "/etc/k26-now"
