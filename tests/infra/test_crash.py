"""A fixed sample of the crash harness (tests/infra/crash) in `make test`; `make crash-test` runs
every task boundary of deploy.yml. The point changes the DDTree budget, so the killed run had
something to lose: the unit rendered and not yet restarted."""

from __future__ import annotations

import pytest

from .conftest import deploy
from .crash.harness import crash_and_rerun

SAMPLE = [
    # the unit and env written, the restart handler not yet run: the re-run renders nothing new and
    # must still restart (the lost-restart case); the other point, health and smoke passed and
    # `current` not yet moved, runs with `make crash-test POINTS=...`
    ("Verify the unit with systemd-analyze", 12),
]


@pytest.fixture(scope="module")
def inventory_settings_after(converged):
    """The other tests expect the inventory's settings: deploy them again when the sample is done."""
    yield
    play = deploy()
    assert play.rc == 0, play.out[-3000:]


@pytest.mark.parametrize("at_name,budget", SAMPLE, ids=["after-render"])
def test_a_deploy_killed_at_a_task_boundary_is_made_whole_by_the_next_run(inventory_settings_after, at_name, budget):
    point = crash_and_rerun("deploy.yml", ["-e", f"k26_ddtree_budget={budget}"], at_name=at_name)
    assert point.killed, f"the run was not killed at {at_name!r}"
    assert point.ok, point.detail
