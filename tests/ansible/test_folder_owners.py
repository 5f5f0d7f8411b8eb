"""Issue 72, item 3: no folder root owns inside a folder a service may write, nor the reverse - every pair of the
owned-folder variables (k26_relations.ROOT_FOLDERS x WRITABLE_FOLDERS), each way round and equal, refused naming both;
the roles' defaults and folders kept apart pass; the check play refuses the issue's examples before any connection."""

from __future__ import annotations

import itertools
import json

import pytest

from .conftest import load_filters
from .test_check_first import check_good_fleet

R = load_filters("k26_relations")
DEFAULTS = R.k26_folder_values({})
WRITABLE = list(R.WRITABLE_FOLDERS)


def values_with(root_name: str, root: str, writable_name: str, writable: str) -> dict[str, str]:
    """The defaults, with every other folder moved out of the way, then ROOT_NAME and WRITABLE_NAME set."""
    values = {name: f"/srv/apart/{name}" for name in DEFAULTS}
    values[root_name] = root
    if writable_name.startswith("k26_"):
        values[writable_name] = writable
    return values


def placed(writable_name: str) -> str:
    return writable_name if not writable_name.startswith("k26_") else "/srv/w/state"


def test_the_roles_defaults_keep_every_pair_apart():
    assert set(DEFAULTS) == {*R.ROOT_FOLDERS, "k26_state_dir"}, set(DEFAULTS) ^ {*R.ROOT_FOLDERS, "k26_state_dir"}
    assert R.k26_folder_owner_errors(DEFAULTS, monitor=True) == []


PAIRS = list(itertools.product(R.ROOT_FOLDERS, WRITABLE, ("inside", "holds", "equal")))


@pytest.mark.parametrize("root_name,writable_name,how", PAIRS, ids=[f"{r}-{w.strip('/').replace('/', '_')}-{h}"
                                                                    for r, w, h in PAIRS])
def test_every_pair_that_nests_is_refused_naming_both(root_name, writable_name, how):
    writable = placed(writable_name)
    root = {"inside": writable + "/root-owned", "holds": writable.rsplit("/", 1)[0], "equal": writable}[how]
    values = values_with(root_name, root, writable_name, writable)
    errors = R.k26_folder_owner_errors(values, monitor=True)
    # one message per writable folder it nests with (/var/lib holds both of the monitor's)
    assert errors and all(e.startswith(f"{root_name}={root} is invalid with ") for e in errors), errors
    assert sum(writable_name in e for e in errors) == 1 and len(errors) <= 2, errors
    # apart (a sibling with a common prefix of characters, not of folders) passes
    values[root_name] = writable + "-apart"
    assert R.k26_folder_owner_errors(values, monitor=True) == []


@pytest.mark.parametrize("change,said", [
    ({"k26_lock_dir": "/var/lib/k26/locks"}, "k26_lock_dir=/var/lib/k26/locks is invalid with k26_state_dir=/var/lib/k26"),
    ({"k26_rollback_root": "/var/lib/k26/rollback"}, "k26_rollback_root=/var/lib/k26/rollback is invalid with k26_state_dir"),
    ({"k26_textfile_dir": "/var/lib/k26/textfile"}, "k26_textfile_dir=/var/lib/k26/textfile is invalid with k26_state_dir"),
    ({"k26_state_dir": "/var/lib/k26-rollback"}, "k26_rollback_root=/var/lib/k26-rollback is invalid with k26_state_dir"),
    ({"k26_monitoring_config_dir": "/var/lib/k26-prometheus/conf"}, "is invalid with /var/lib/k26-prometheus (fixed)"),
])
def test_the_issues_examples_are_refused(change, said):
    errors = " | ".join(R.k26_folder_owner_errors(R.k26_folder_values(change), monitor=True))
    assert said in errors, errors


def test_a_host_that_runs_no_server_or_no_monitoring_is_judged_by_its_own_writers():
    inside_state = R.k26_folder_values({"k26_textfile_dir": "/var/lib/k26/textfile"})
    assert R.k26_folder_owner_errors(inside_state, monitor=True, server=False) == []
    inside_prometheus = R.k26_folder_values({"k26_textfile_dir": "/var/lib/k26-prometheus/textfile"})
    assert R.k26_folder_owner_errors(inside_prometheus, monitor=False) == []
    assert R.k26_folder_owner_errors(inside_prometheus, monitor=True)


def test_the_check_play_refuses_a_root_folder_inside_the_state_folder_before_any_connection(tmp_path):
    r, out = check_good_fleet(tmp_path, extra=["-e", json.dumps({"k26_textfile_dir": "/var/lib/k26/textfile"})])
    assert r.returncode != 0 and "UNREACHABLE" not in out, out[-2000:]
    assert "k26_textfile_dir=/var/lib/k26/textfile is invalid with k26_state_dir=/var/lib/k26" in out, out[-2000:]
