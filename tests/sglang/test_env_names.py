"""k26_service_env's allow-list (issue 72) names only settings the pinned libraries read: every name on
roles/preflight/vars/main.yml's per-library list is found in that library's own files as installed from
requirements/sglang-test.txt (its Python sources and shared objects), the plugin's in ddtree's switch registry.
CUDA's names are read by the driver (libcuda), which no wheel ships: they are the one list nothing here checks."""

from __future__ import annotations

import importlib.util
import mmap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULE = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_inputs"]["k26_service_env"]
# library -> (the packages whose files hold its names, the file suffixes read)
WHERE = {
    "NCCL": (["nvidia.nccl"], (".so", ".so.2")),
    "PyTorch": (["torch"], (".py", ".so")),
    "SGLang": (["sglang", "sgl_kernel"], (".py",)),
    "NVSHMEM": (["nvidia.nvshmem"], (".so", ".so.3", ".py")),
    "Triton": (["triton"], (".py",)),
    "Hugging Face": (["huggingface_hub", "transformers", "tokenizers"], (".py", ".so")),
    "OpenMP": (["torch"], (".so.1",)),
}
UNCHECKED = {"CUDA": "read by the NVIDIA driver (libcuda.so), which no wheel ships"}


def package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None:
        return None
    return Path(list(spec.submodule_search_locations)[0]) if spec.submodule_search_locations else Path(spec.origin).parent


def holds(path: Path, needles: set[bytes]) -> set[bytes]:
    """The needles PATH's bytes contain."""
    with path.open("rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:          # an empty file
            return set()
        with data:
            return {n for n in needles if data.find(n) != -1}


def found_in(packages: list[str], suffixes: tuple[str, ...], names: list[str]) -> set[str]:
    left = {n.encode() for n in names}
    for package in packages:
        where = package_dir(package)
        if where is None:
            continue
        for path in where.rglob("*"):
            if left and path.is_file() and path.name.endswith(suffixes):
                left -= holds(path, left)
    return {n for n in names if n.encode() not in left}


def test_every_library_on_the_list_is_checked_here_or_said_not_to_be():
    assert set(RULE["names"]) == set(WHERE) | set(UNCHECKED) | {"DDTree plugin"}


@pytest.mark.parametrize("library", sorted(WHERE))
def test_every_listed_name_is_read_by_the_pinned_library(library):
    packages, suffixes = WHERE[library]
    assert any(package_dir(p) for p in packages), f"none of {packages} is installed in this venv"
    names = RULE["names"][library]
    missing = sorted(set(names) - found_in(packages, suffixes, names))
    assert not missing, f"{library}: {missing} appear in none of {packages}' files: not a setting of the pinned version"


def test_the_plugins_names_are_its_registrys_operator_switches():
    from ddtree.switches import SWITCHES
    operator = {s.name for s in SWITCHES if not s.test_bed_only}
    listed = set(RULE["names"]["DDTree plugin"])
    assert listed <= operator, listed - operator
    # the registry's width settings are the unit's flags: owned, never k26_service_env's
    assert operator - listed <= set(RULE["owned"]), operator - listed - set(RULE["owned"])


def test_a_fault_in_the_check_shows_a_name_no_library_reads():
    assert found_in(["nvidia.nccl"], (".so", ".so.2"), ["NCCL_DEBUG", "NCCL_NO_SUCH_SETTING_K26"]) == {"NCCL_DEBUG"}
