"""Helpers to run Ansible from the tests with a scratch ANSIBLE_HOME."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from testbed.ansible_run import BIN, DEMO_VAULT_PASSWORD, ansible_env, run  # noqa: F401  (the tests import them here)

ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def load_filters(name: str = "k26_inputs"):
    """roles/k26_defaults/filter_plugins/NAME.py as a module (k26_inputs: the input rules and the filters they serve;
    k26_relations: the rules between settings; k26_yaml: the YAML 1.1 traps)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / f"roles/k26_defaults/filter_plugins/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_k26_inputs():
    return load_filters("k26_inputs")


@pytest.fixture(scope="session")
def vault_pass(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("vault") / "pass"
    p.write_text(DEMO_VAULT_PASSWORD + "\n")
    return p


# The unit hides /home, /root, /run/user and the temporary folders (ProtectHome, PrivateTmp), and preflight refuses a
# model there; pytest's own folders are under /tmp, so a model a local preflight run checks lives here (removed after).
VISIBLE_BASE = Path(os.environ.get("K26_TEST_VISIBLE_DIR", "/var/lib/k26-test-models"))


@pytest.fixture(scope="session")
def visible_dir(tmp_path_factory):
    """A factory of empty folders outside the ones the unit cannot see, all removed at the session's end."""
    made: list[Path] = []

    def make(name: str) -> Path:
        VISIBLE_BASE.mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=VISIBLE_BASE))
        made.append(out)
        return out

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        VISIBLE_BASE.rmdir()                      # only when no other session's folder is left in it
