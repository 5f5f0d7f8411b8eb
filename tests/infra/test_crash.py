"""A fixed sample of the crash harness (tests/infra/crash) in `make test`; `make crash-test` runs
every task boundary of every playbook, killed and with its SSH connection dropped. Each sample point
changes the DDTree budget, so the interrupted run had something to lose. `make test` runs the deploy killed after
its render followed by a sweep and then a whole deploy (the lost restart healed); the same kill re-run by a deploy
alone, and a kill between loop items, are extended."""

from __future__ import annotations

import pytest

from .conftest import deploy
from .crash.harness import interrupt_and_rerun
from .crash.scenarios import SCENARIOS, deploy_to

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


@pytest.mark.extended       # ~75 s; the next test kills the deploy at the same point and a whole deploy heals it
@pytest.mark.parametrize("mode,at_name,budget", SAMPLE, ids=["killed-after-render"])
def test_a_deploy_interrupted_at_a_task_boundary_is_made_whole_by_the_next_run(inventory_settings_after, mode,
                                                                                at_name, budget):
    point = interrupt_and_rerun(deploy_to(budget), mode=mode, at_name=at_name)
    assert point.interrupted, f"the run was not interrupted at {at_name!r} ({mode})"
    assert point.ok, point.detail


def test_a_deploy_killed_after_its_render_makes_a_sweep_refuse_and_name_the_deploy_that_heals_it(
        inventory_settings_after):
    """Issue 48: one playbook interrupted, a different one next. A deploy killed after writing its unit leaves files
    no deploy verified; a sweep then refuses them before any change (it would save them as the original to restore
    and start them) and names deploy.yml, which, run whole, makes the host whole."""
    point = interrupt_and_rerun(deploy_to(8), mode="kill", at_name="Verify the unit with systemd-analyze",
                                then=SCENARIOS["playbooks/sweep.yml"])
    assert point.interrupted and point.ok, point.detail
    assert point.note.startswith("playbooks/sweep.yml refused and named deploy.yml, nothing changed"), point.note


@pytest.mark.extended       # ~2 min; the callback's kill between items runs in make test on a local play
def test_a_deploy_killed_in_the_middle_of_a_looped_task_is_made_whole_by_the_next_run(inventory_settings_after):
    """Issue 48: a kill between two items of a looped task (the record's clearing of interrupted runs' marks, after
    its first item), then the same deploy again."""
    point = interrupt_and_rerun(deploy_to(12), mode="kill", at_name="Forget what interrupted sweeps and validations saved",
                                at_item=1)
    assert point.interrupted and point.ok, point.detail
