"""CLI of the crash harness: the chosen task boundaries of the chosen playbooks, each interrupted by
SIGKILL and/or a dropped SSH connection, a table at the end.

    python -m tests.infra.crash [PLAYBOOK ...|all] [--mode kill|ssh-drop|both] [--points all|every:N|N,M,...]
                                [--pool] [--report FILE] [--then PLAYBOOK|pairs] [--at-name NAME --item N]

--then runs another playbook whole after each interrupted run (`pairs`: deploy then sweep, sweep then deploy,
rollback then deploy); --at-name NAME --item N kills the looped task named like NAME after its N-th item.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from ..conftest import CACHE, guest
from .harness import ALT_FOLDERS, MODES, SETTINGS, TARGETS, CrashPoint, interrupt_and_rerun, play, task_starts
from .scenarios import PAIRS, SCENARIOS, scenario


def chosen_points(spec: str, count: int) -> list[int]:
    """'all', 'every:N' (1, 1+N, ...), 'every:N@K' (K, K+N, ...) or a comma-separated list of 1-based
    task starts."""
    if spec == "all":
        return list(range(1, count + 1))
    every = re.fullmatch(r"every:([1-9]\d*)(?:@([1-9]\d*))?", spec)
    if every:
        return list(range(int(every.group(2) or 1), count + 1, int(every.group(1))))
    try:
        points = [int(p) for p in spec.split(",")]
    except ValueError:
        raise SystemExit(f"--points={spec!r}: expected all, every:N, every:N@K or a list such as 3,17,40") from None
    bad = [p for p in points if not 1 <= p <= count]
    if bad:
        raise SystemExit(f"--points={spec!r}: {bad} outside 1..{count} (the run starts {count} tasks)")
    return points


def run_playbook(playbook: str, modes: list[str], spec: str, pool: bool, report, then: str = "") -> list[CrashPoint]:
    names = task_starts(scenario(playbook), pool)
    results = []
    shown = f"{playbook} then {then}" if then else playbook
    for mode in modes:
        for k in chosen_points(spec, len(names)):
            point = interrupt_and_rerun(scenario(playbook), k, mode, name=names[k - 1], pool=pool,
                                        then=scenario(then) if then else None)
            results.append(point)
            line = f"| {shown} | {mode} | {k} | {point.task} | {point.verdict} | {point.detail} |"
            print(line, flush=True)
            if report:
                report.write(line.replace("\n", " ") + "\n")
                report.flush()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.infra.crash", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("playbooks", nargs="*", default=["deploy.yml"], help=f"'all' or some of {', '.join(SCENARIOS)}")
    ap.add_argument("--mode", default="kill", choices=(*MODES, "both"))
    ap.add_argument("--points", default="all",
                    help="all, every:N, every:N@K (from task K), or a comma-separated list of task starts (1-based)")
    ap.add_argument("--pool", action="store_true", help="take-out and put-back through the sandbox gateway (deployed)")
    ap.add_argument("--report", type=Path, help="append the table's rows to this file")
    ap.add_argument("--then", default="", help="run this playbook whole after each interrupted run ('pairs': "
                    + ", ".join(f"{a} then {b}" for a, b in PAIRS) + ")")
    ap.add_argument("--at-name", default="", help="interrupt the first task whose name holds this (with --item)")
    ap.add_argument("--item", type=int, default=0, help="kill the --at-name task after its N-th loop item")
    ap.add_argument("--hosts", default="sandbox", help="the server hosts each run targets and checks: sandbox, or "
                    "sandbox,sandbox2 (a roll over both; the playbook's own checks judge the first)")
    ap.add_argument("--folders", choices=("default", "alt"), default="default",
                    help="alt: every run deploys into " + ", ".join(f"{k}={v}" for k, v in ALT_FOLDERS.items()))
    args = ap.parse_args(argv)
    unknown = [h for h in args.hosts.split(",") if h not in TARGETS]
    if unknown:
        ap.error(f"--hosts={args.hosts}: {unknown} not among {', '.join(TARGETS)}")
    SETTINGS.targets = tuple(TARGETS[h] for h in args.hosts.split(","))
    SETTINGS.folders = dict(ALT_FOLDERS) if args.folders == "alt" else {}
    if args.item and not args.at_name:
        ap.error("--item needs --at-name (the looped task)")
    playbooks = list(SCENARIOS) if args.playbooks == ["all"] else args.playbooks
    modes = list(MODES) if args.mode == "both" else [args.mode]
    report = args.report.open("a") if args.report else None
    results: dict[str, list[CrashPoint]] = {}
    runs = PAIRS if args.then == "pairs" else [(p, args.then) for p in playbooks]
    try:
        if args.at_name:
            for playbook, then in runs:
                point = interrupt_and_rerun(scenario(playbook), mode="kill", at_name=args.at_name, at_item=args.item,
                                            pool=args.pool, then=scenario(then) if then else None)
                print(f"| {playbook}{f' then {then}' if then else ''} | kill after item {args.item} | - | "
                      f"{point.task} | {point.verdict} | {point.detail} |", flush=True)
                results.setdefault(playbook, []).append(point)
        else:
            for playbook, then in runs:
                results[f"{playbook}{f' then {then}' if then else ''}"] = run_playbook(
                    playbook, modes, args.points, args.pool, report, then)
    finally:
        # the inventory's own settings (and folders) again for whatever runs next
        alt = SETTINGS.folders
        SETTINGS.folders = {}
        play("deploy.yml", [], Path(tempfile.mkdtemp(prefix="k26-crash-end-", dir=CACHE)), args.pool)
        for target in SETTINGS.targets if alt else ():
            guest("rm -rf " + " ".join(alt.values()), host=target.guest, check=False)
    total = failed = 0
    for playbook, points in results.items():
        for mode in modes:
            mine = [p for p in points if p.mode == mode and p.reached]
            passed = sum(p.ok for p in mine)
            survived = sum(p.ok and not p.interrupted for p in mine)
            missed = sum(not p.reached for p in points if p.mode == mode)
            total, failed = total + len(mine), failed + len(mine) - passed
            print(f"{playbook} ({mode}): {len(mine)} interruption points tried, {passed} passed"
                  f"{f' ({survived} of them not interrupted by the drop)' if survived else ''}, {len(mine) - passed} failed"
                  f"{f'; {missed} chosen task starts not reached by the run' if missed else ''}")
    return 0 if failed == 0 and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
