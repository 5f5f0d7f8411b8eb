"""The switch registry (ddtree.switches): one declaration per DDTREE_* and SGLANG_DDTREE_* variable, typed
reads with clear errors, and the places that must agree with it (the code, the docs, the Ansible filter)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from ddtree.settings import DDTreeConfigError
from ddtree import switches

ROOT = Path(__file__).resolve().parents[2]
NAME_IN_TEXT = re.compile(r"(?<![A-Z0-9_])(?:SGLANG_)?DDTREE_[A-Z_]*[A-Z]")


def test_every_field_is_filled_by_exactly_one_switch():
    names = [s.name for s in switches.SWITCHES]
    assert len(set(names)) == len(names) and all(n.startswith(("SGLANG_DDTREE_", "DDTREE_")) for n in names)
    assert sorted(s.field for s in switches.SWITCHES) == sorted(f.name for f in dataclasses.fields(switches.Switches))


def test_unset_gives_the_declared_defaults():
    assert switches.read({}) == switches.Switches()
    read = switches.read({})
    assert read.graph_check and read.sync_check is None and read.dump_steps == 400 and read.profile_steps is None


@pytest.mark.parametrize("text,value", [("1", True), ("on", True), ("TRUE", True), ("yes", True),
                                        ("0", False), ("off", False), ("false", False), ("", True)])
def test_a_flag_takes_the_usual_spellings(text, value):
    assert switches.read({"SGLANG_DDTREE_GRAPH_CHECK": text}).graph_check is value      # unset: its default, on


def test_each_kind_reads_its_values():
    read = switches.read({"SGLANG_DDTREE_BUDGET": "1:64,8:32", "SGLANG_DDTREE_SYNC_CHECK": "warn",
                          "SGLANG_DDTREE_PROFILE_STEPS": "0", "SGLANG_DDTREE_DUMP": "/tmp/d",
                          "SGLANG_DDTREE_DUMP_STEPS": "12", "SGLANG_DDTREE_GRAPH_CHECK": "off"})
    assert read.budget == "1:64,8:32" and read.sync_check == "warn" and read.profile_steps is None
    assert read.dump == Path("/tmp/d") and read.dump_steps == 12 and read.graph_check is False
    assert switches.read({"SGLANG_DDTREE_PROFILE_STEPS": "40"}).profile_steps == 40


@pytest.mark.parametrize("name,value,expects", [
    ("SGLANG_DDTREE_GRAPH_CHECK", "maybe", "1 or 0"),
    ("SGLANG_DDTREE_SYNC_CHECK", "loud", "one of warn, error"),
    ("SGLANG_DDTREE_PROFILE_STEPS", "-3", "a whole number of steps"),
    ("SGLANG_DDTREE_DUMP_STEPS", "0", "a whole number >= 1"),
    ("SGLANG_DDTREE_DUMP", "rel/dir", "an absolute folder path"),
    ("SGLANG_DDTREE_FAULT", "cousin", "one of sibling"),
])
def test_a_bad_value_names_the_variable_the_value_and_what_it_takes(name, value, expects):
    with pytest.raises(DDTreeConfigError) as error:
        switches.read({name: value})
    message = str(error.value)
    assert message.startswith(f"{name}={value!r} is invalid: expected {expects}") and "env file" in message


def test_no_module_reads_a_switch_the_registry_does_not_declare():
    declared = {s.name for s in switches.SWITCHES}
    used = {name for path in (ROOT / "src").rglob("*.py") for name in NAME_IN_TEXT.findall(path.read_text())}
    assert used - declared == set()
    assert {"DDTREE_BACKEND", "DDTREE_DEBUG"} <= used               # the scan sees the core's names too
    # and the environment is read in one place: no other module looks a variable up itself
    lookups = re.compile(r"environ(\.get)?\(|environ\[|getenv\(")
    readers = {str(path.relative_to(ROOT / "src/ddtree")) for path in (ROOT / "src/ddtree").rglob("*.py")
               if lookups.search(path.read_text())}
    assert readers <= {"switches.py", "sglang/setup/refusals.py"}, readers  # refusals: SGLang's own SGLANG_SIMULATE_ACC_LEN


def test_the_cores_switches_are_read_through_the_registry():
    """DDTREE_BACKEND and DDTREE_DEBUG as the core reads them: a bad value names the variable (it was silently
    'off' or a bare ValueError before the registry held them)."""
    from ddtree import _checks
    from ddtree.backend import resolve_backend
    import torch
    assert switches.one("backend", {}) == "auto" and switches.one("debug", {}) is False
    assert switches.one("debug", {"DDTREE_DEBUG": "1"}) is True
    with pytest.raises(DDTreeConfigError, match=r"^DDTREE_BACKEND='cuda' is invalid: expected one of auto, torch, triton"):
        switches.one("backend", {"DDTREE_BACKEND": "cuda"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDTREE_BACKEND", "torch")
        assert resolve_backend(None, torch.device("cpu")) == "torch"
        mp.setenv("DDTREE_DEBUG", "maybe")
        with pytest.raises(DDTreeConfigError, match="DDTREE_DEBUG='maybe'"):
            _checks.debug_enabled()


def test_the_readme_table_is_the_registrys():
    readme = (ROOT / "docs/plugin.md").read_text()
    assert switches.table() in readme, "regenerate it: python -m ddtree.switches"


def test_the_ansible_filter_refuses_exactly_the_test_bed_switches():
    spec = importlib.util.spec_from_file_location("k26_inputs",
                                                  ROOT / "roles/k26_defaults/filter_plugins/k26_inputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.TEST_BED_ONLY) == {s.name for s in switches.SWITCHES if s.test_bed_only}
