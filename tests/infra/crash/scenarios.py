"""The five playbooks under the crash harness: what each point runs and what must hold after the re-run
beyond the common invariants (harness.invariants)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from ..conftest import CACHE, ROOT, guest
from .harness import SETTINGS, UNIT, Before, Scenario, main_pid, play


def _scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=CACHE))


def _budget() -> int:
    found = re.search(r"--speculative-ddtree-budget (\d+)", guest(f"cat {UNIT}", check=False).stdout)
    return int(found.group(1)) if found else 0


def _unit_restored(k: int, before: Before) -> list[str]:
    """Sweep and validate end on the configuration that ran before them."""
    now = guest(f"cat {UNIT}", check=False).stdout
    return [] if now == before.unit else ["the unit is not the one that ran before the run (the original was not restored)"]


# --- deploy.yml: every point changes the DDTree budget (8 and 12 by turns), so the interrupted run had
# work to lose --------------------------------------------------------------------------------------

def _deploy_args(k: int, before: Before) -> list[str]:
    return ["-e", f"k26_ddtree_budget={8 if k % 2 else 12}"]


def _deploy_expect(k: int, before: Before) -> list[str]:
    return _budget_is(8 if k % 2 else 12, "the deploy asked for")


def _budget_is(want: int, why: str) -> list[str]:
    return [] if _budget() == want else [f"the unit's budget is {_budget()}, {why} {want}"]


def deploy_to(budget: int) -> Scenario:
    """deploy.yml with one budget at every point (the fixed sample in make test)."""
    return Scenario("deploy.yml", lambda k, before: ["-e", f"k26_ddtree_budget={budget}"],
                    lambda k, before: _budget_is(budget, "the deploy asked for"))


# --- sweep.yml and validate.yml: the smallest runs that still render, restart and restore ------------

SWEEP = {"sweep_budgets": [4], "sweep_topk_caps": [4], "sweep_max_tokens": 8, "sweep_references": [],
         "sweep_temperatures": [0.0], "sweep_concurrency": 2}


@cache
def _validate_prompts() -> str:
    path = _scratch("k26-crash-prompts-") / "prompts.json"
    path.write_text(json.dumps(json.loads((ROOT / "validation/prompts.json").read_text())[:3]))
    return str(path)


def _sweep_args(k: int, before: Before) -> list[str]:
    return ["-e", json.dumps(SWEEP), "-e", f"sweep_results_root={_scratch('k26-crash-sweep-')}"]


def _validate_args(k: int, before: Before) -> list[str]:
    two = {"validate_configs": [{"name": "NONE", "algorithm": "NONE"},
                                {"name": "DDTREE-graphs", "algorithm": "DDTREE", "cuda_graph": True}],
           "validate_prompts": _validate_prompts(), "validate_max_tokens": 8, "validate_concurrency": 2}
    return ["-e", json.dumps(two), "-e", f"validate_results_root={_scratch('k26-crash-validate-')}"]


# --- snapshot.yml: a fresh tag each run (the default, named after the time), one scratch repository ---

@cache
def _snapshot_repo() -> Path:
    return _scratch("k26-crash-snapshots-") / "repo"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)


def _snapshot_args(k: int, before: Before) -> list[str]:
    return ["-e", f"k26_snapshot_repo={_snapshot_repo()}"]


def _snapshot_expect(k: int, before: Before) -> list[str]:
    """A snapshot never restarts the service; the repository is clean and its newest tag records the
    release that runs."""
    repo, problems = _snapshot_repo(), []
    if main_pid() != before.pid:
        problems.append(f"the service was restarted by a snapshot (PID {before.pid} -> {main_pid()})")
    dirty = _git(repo, "status", "--porcelain").stdout.strip()
    if dirty:
        problems.append(f"the snapshot repository has uncommitted changes: {dirty[:200]}")
    newest = _git(repo, "tag", "--sort=-creatordate").stdout.split()
    manifest = _git(repo, "show", f"{newest[0]}:sandbox/manifest.json").stdout if newest else ""
    current = guest(f"readlink -f {SETTINGS.prefix}/current", check=False).stdout.strip().rsplit("/", 1)[-1]
    if not manifest or json.loads(manifest).get("release") != current:
        problems.append(f"the newest tag {newest[:1]} does not record the running release {current}")
    return problems


# --- rollback.yml: two snapshots (budgets 8 and 12) taken once; each point restores the one that does
# not run ---------------------------------------------------------------------------------------------

ROLLBACK_TAGS = {8: "crash-b8", 12: "crash-b12"}


@cache
def _rollback_repo() -> Path:
    repo = _scratch("k26-crash-rollback-") / "repo"
    for budget, tag in ROLLBACK_TAGS.items():
        for playbook, extra in (("deploy.yml", ["-e", f"k26_ddtree_budget={budget}"]),
                                ("snapshot.yml", ["-e", f"k26_snapshot_repo={repo}", "-e", f"snapshot_tag={tag}"])):
            done = play(playbook, extra, _scratch("k26-crash-setup-"))
            if done.returncode != 0:
                raise RuntimeError(f"setting up the rollback points: {playbook} failed: {done.stdout[-2000:]}")
    return repo


def _rollback_target(before: Before) -> int:
    return 12 if before.budget == 8 else 8


def _rollback_args(k: int, before: Before) -> list[str]:
    return ["-e", f"k26_snapshot_repo={_rollback_repo()}", "-e", f"snapshot_tag={ROLLBACK_TAGS[_rollback_target(before)]}"]


def _rollback_expect(k: int, before: Before) -> list[str]:
    return _budget_is(_rollback_target(before), "the snapshot restored holds")


DEPLOY = Scenario("deploy.yml", _deploy_args, _deploy_expect)
# roles/rollback/tasks/begin.yml: a sweep or validation refuses files no deploy verified, naming deploy.yml
UNVERIFIED = "Nothing was changed. Run deploy.yml first"

SCENARIOS = {
    "deploy.yml": DEPLOY,
    "playbooks/sweep.yml": Scenario("playbooks/sweep.yml", _sweep_args, _unit_restored,
                                    expect_after_other=lambda k, before: [], refusal=UNVERIFIED, fix=DEPLOY),
    "playbooks/validate.yml": Scenario("playbooks/validate.yml", _validate_args, _unit_restored,
                                       expect_after_other=lambda k, before: [], refusal=UNVERIFIED, fix=DEPLOY),
    "playbooks/rollback.yml": Scenario("playbooks/rollback.yml", _rollback_args, _rollback_expect,
                                       prepare=lambda: _rollback_repo() and None),
    "snapshot.yml": Scenario("snapshot.yml", _snapshot_args, _snapshot_expect),
}
# one playbook interrupted, a different one run whole next (issue 48): what an operator does after a crash
PAIRS = [("deploy.yml", "playbooks/sweep.yml"), ("playbooks/sweep.yml", "deploy.yml"),
         ("playbooks/rollback.yml", "deploy.yml")]


def scenario(playbook: str) -> Scenario:
    try:
        return SCENARIOS[playbook]
    except KeyError:
        raise SystemExit(f"playbook={playbook!r}: the harness knows {', '.join(SCENARIOS)}") from None
