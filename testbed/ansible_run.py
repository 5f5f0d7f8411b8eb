"""ansible-playbook (the one beside this Python) run in the repository with a scratch ANSIBLE_HOME: the test-bed
plan's renders (production_plan) and the Ansible tests (tests/ansible/conftest.py takes these from here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEMO_VAULT_PASSWORD = "k26-demo-vault-password"  # documented demo password of the example vault


def ansible_env(tmp: Path) -> dict:
    env = os.environ.copy()
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ANSIBLE_HOME=str(tmp / "home"),
               ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return env


def run(args: list[str], tmp: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """ARGS in the repository with Ansible's scratch under TMP; ENV adds variables to that environment."""
    return subprocess.run(args, cwd=ROOT, env={**ansible_env(tmp), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
