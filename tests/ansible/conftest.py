"""Helpers to run Ansible from the tests with a scratch ANSIBLE_HOME."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEMO_VAULT_PASSWORD = "k26-demo-vault-password"  # documented demo password of the example vault


@functools.lru_cache(maxsize=1)
def load_k26_inputs():
    """roles/k26_defaults/filter_plugins/k26_inputs.py as a module (the input rules and the filters they serve)."""
    spec = importlib.util.spec_from_file_location("k26_inputs", ROOT / "roles/k26_defaults/filter_plugins/k26_inputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ansible_env(tmp: Path) -> dict:
    env = os.environ.copy()
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ANSIBLE_HOME=str(tmp / "home"),
               ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return env


def run(args: list[str], tmp: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """ARGS in the repository with Ansible's scratch under TMP; ENV adds variables to that environment."""
    return subprocess.run(args, cwd=ROOT, env={**ansible_env(tmp), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def vault_pass(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("vault") / "pass"
    p.write_text(DEMO_VAULT_PASSWORD + "\n")
    return p
