"""A fixed sample of the crash harness (tests/infra/crash) in `make test`; `make crash-test` runs
every task boundary of every playbook, killed and with its SSH connection dropped. Each sample point
changes the DDTree budget, so the interrupted run had something to lose."""

from __future__ import annotations

import pytest

from .conftest import deploy
from .crash.harness import interrupt_and_rerun
from .crash.scenarios import deploy_to

SAMPLE = [
    # the unit and env written, the restart handler not yet run: the re-run renders nothing new and
    # must still restart (the lost-restart case)
    ("kill", "Verify the unit with systemd-analyze", 12),
]
# A dropped connection in the smoke requests (no rescue, no always, the locks of a run that is gone)
# is test_fleet.py's host lost mid-roll, behind the gateway; `make crash-test MODE=ssh-drop` runs it
# at every task boundary. One sample here keeps `make test` within its time.


@pytest.fixture(scope="module")
def inventory_settings_after(converged, request):
    """The other tests expect the inventory's settings: deploy them again when the sample is done - unless the
    session's fleet deploy comes next (this module runs last of the single-host ones: conftest's order), which
    renders them on this host anyway."""
    yield
    if {item.fspath.basename for item in request.session.items} & {"test_monitoring.py", "test_fleet.py"}:
        return
    play = deploy()
    assert play.rc == 0, play.out[-3000:]


@pytest.mark.parametrize("mode,at_name,budget", SAMPLE, ids=["killed-after-render"])
def test_a_deploy_interrupted_at_a_task_boundary_is_made_whole_by_the_next_run(inventory_settings_after, mode,
                                                                                at_name, budget):
    point = interrupt_and_rerun(deploy_to(budget), mode=mode, at_name=at_name)
    assert point.interrupted, f"the run was not interrupted at {at_name!r} ({mode})"
    assert point.ok, point.detail
