#!/usr/bin/env python3
"""make test's time budget (issue 43): each lane's command timed and logged, and a report at the end.

  test_budget.py run NAME LOGDIR -- CMD...      run CMD, its output to stdout and LOGDIR/NAME.log, and append
                                                "NAME SECONDS RC" to LOGDIR/lanes.txt; exit with CMD's code
  test_budget.py report LOGDIR START BUDGET     each lane's time (several commands of one lane add up), the
                                                slowest tests each lane's pytest printed (--durations), the whole
                                                run's time since START (epoch seconds), and a WARNING line past
                                                BUDGET seconds
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

SLOWEST = re.compile(r"=+ slowest \d+ durations =+\n(.*?)(?=\n=+|\Z)", re.DOTALL)


def run_lane(name: str, logdir: Path, cmd: list[str]) -> int:
    logdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(logdir / f"{name}.log", "a", buffering=1) as log:          # line-buffered: the log follows
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})    # the log follows the run
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        rc = proc.wait()
    with open(logdir / "lanes.txt", "a") as f:
        f.write(f"{name} {time.monotonic() - t0:.0f} {rc}\n")
    return rc


def lane_times(logdir: Path) -> dict[str, tuple[int, int]]:
    """name -> (seconds, worst exit code) over the lane's commands."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    path = logdir / "lanes.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, seconds, rc = line.split()
        out[name][0] += int(seconds)
        out[name][1] = max(out[name][1], int(rc))
    return {k: (v[0], v[1]) for k, v in out.items()}


def slowest(logdir: Path, name: str, count: int = 15) -> list[str]:
    """The slowest tests a lane's pytest runs printed, slowest first."""
    log = logdir / f"{name}.log"
    rows = []
    for block in SLOWEST.findall(log.read_text(errors="replace") if log.exists() else ""):
        rows += [ln for ln in block.splitlines() if re.match(r"\s*[\d.]+s ", ln)]
    return sorted(rows, key=lambda ln: -float(ln.split("s", 1)[0]))[:count]


def report(logdir: Path, start: float, budget: int) -> str:
    lines = ["", "== make test: time by lane =="]
    for name, (seconds, rc) in sorted(lane_times(logdir).items()):
        lines.append(f"{name}: {seconds // 60} min {seconds % 60} s ({'passed' if rc == 0 else f'exit {rc}'}); "
                     "slowest tests:")
        lines += [f"    {row.strip()}" for row in slowest(logdir, name)]
    total = int(time.time() - start)
    lines.append(f"make test: {total // 60} min {total % 60} s in all (budget {budget // 60} min)")
    if total > budget:
        lines.append(f"WARNING: make test took {total // 60} min, past its {budget // 60}-minute budget (CI gives 90): "
                     "the slowest tests above are where to look; move exhaustive ones to their own make target")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run")
    r.add_argument("name")
    r.add_argument("logdir", type=Path)
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("report")
    p.add_argument("logdir", type=Path)
    p.add_argument("start", type=float)
    p.add_argument("budget", type=int)
    args = ap.parse_args(argv)
    if args.verb == "run":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            ap.error("run needs a command after --")
        return run_lane(args.name, args.logdir, cmd)
    print(report(args.logdir, args.start, args.budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
