"""The hash-locked requirements (tools/lock.py, `make lock`): each lock is the lock of its pins, every
package carries hashes, and a lock that disagrees with its pins is named with the fix."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k26_lock", ROOT / "tools/lock.py")
lock = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("k26_lock", lock)          # dataclasses look their module up while defining
_spec.loader.exec_module(lock)

LOCKS = [("sglang", "3.11"), ("sandbox", "3.11"), ("gateway", "3.11")]


@pytest.mark.parametrize("name,python", LOCKS)
def test_every_lock_is_the_lock_of_its_pins(name, python):
    pins = (ROOT / f"requirements/{name}.txt").read_text()
    text = (ROOT / f"requirements/{name}.lock").read_text()
    assert lock.disagreements(pins, text) == []
    assert lock.header(text).python == python
    entries = lock.locked(text)
    assert all(count >= 1 for _, count in entries.values())
    assert set(lock.pins(pins)) <= set(entries)


def test_the_production_lock_holds_sglangs_own_pins():
    entries = lock.locked((ROOT / "requirements/sglang.lock").read_text())
    for name, version in {"sglang": "0.5.23", "torch": "2.14.1", "sglang-kernel": "0.4.10",
                          "flashinfer-python": "0.7.2", "transformers": "5.19.0", "xgrammar": "0.2.7"}.items():
        assert entries[name][0] == version, name


def test_the_sandbox_lock_takes_torchs_cpu_build():
    assert lock.locked((ROOT / "requirements/sandbox.lock").read_text())["torch"][0] == "2.13.0+cpu"


@pytest.mark.parametrize("change,message", [
    (lambda pins, text: (pins + "numpy==2.4.6\n", text), "the pins changed after the lock was made: run `make lock`"),
    (lambda pins, text: (pins, text.replace("sglang==0.5.23", "sglang==0.5.22", 1)),
     "sglang is pinned at 0.5.23 but locked at 0.5.22"),
    (lambda pins, text: (pins, "\n".join(text.splitlines()[1:])), "the lock has no '# k26-lock:' first line"),
])
def test_a_lock_that_disagrees_with_its_pins_is_named(change, message):
    pins, text = change((ROOT / "requirements/sglang.txt").read_text(), (ROOT / "requirements/sglang.lock").read_text())
    assert any(message in p for p in lock.disagreements(pins, text)), lock.disagreements(pins, text)


def without_hashes_of(text: str, name: str) -> str:
    """The lock with one package's hash lines removed (and the continuation on its own line ended)."""
    out, inside = [], False
    for line in text.splitlines():
        if lock.PIN.match(line):
            inside = lock.normalized(lock.PIN.match(line)["name"]) == name
            out.append(line.rstrip(" \\") if inside else line)
        elif not (inside and line.strip().startswith("--hash=")):
            out.append(line)
    return "\n".join(out) + "\n"


def test_a_package_without_a_hash_is_named():
    pins = (ROOT / "requirements/gateway.txt").read_text()
    text = without_hashes_of((ROOT / "requirements/gateway.lock").read_text(), "smg")
    assert lock.locked(text)["smg"] == ("1.13.0", 0)
    assert "locked without a hash: smg" in lock.disagreements(pins, text)
