"""CLI of the crash harness: every (or the chosen) task boundary of one playbook, a table at the end."""

from __future__ import annotations

import argparse
import sys

from .harness import CrashPoint, crash_and_rerun, task_starts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.infra.crash", description=__doc__)
    ap.add_argument("playbook", help="e.g. deploy.yml or playbooks/sweep.yml")
    ap.add_argument("--points", default="all", help="'all' or a comma-separated list of task numbers (1-based)")
    ap.add_argument("extra", nargs="*", help="more ansible-playbook arguments (after --)")
    args = ap.parse_args(argv)
    names = task_starts(args.playbook, args.extra + ["-e", "k26_ddtree_budget=16"])
    points = range(1, len(names) + 1) if args.points == "all" else [int(p) for p in args.points.split(",")]
    results: list[CrashPoint] = []
    for k in points:
        # every killed run changes the unit (budgets 8 and 12 by turns): each one had work to lose
        changed = args.extra + ["-e", f"k26_ddtree_budget={8 if k % 2 else 12}"]
        point = crash_and_rerun(args.playbook, changed, k, names[k - 1])
        results.append(point)
        print(f"{k:4d} {'PASS' if point.ok else 'FAIL'} {point.task}: {point.detail}", flush=True)
    passed = sum(p.ok for p in results)
    print(f"{args.playbook}: {len(results)} interruption points tried, {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
