"""The drafts several trainings of one target made (testbed/speed_sweep.sh train runs in SPEED_DIRs of their own, side
by side on the GPU), side by side by their offline accept lengths on the speed sweep's 1-request prompts
(train_pair.py), and the one to sweep: the highest accept length of DFLASH's chain (issue 45's bar of 4 is DFLASH's),
then of DDTREE b64 c8.

    python3 -m training.best_draft /tmp/ddtree-speed-A /tmp/ddtree-speed-B ...

Prints a table (one row per folder: block, distill share, depth decay, batch, minutes, draft steps, the accept
lengths) and, on its last line, the folder of the best draft. A folder whose training wrote no train.json, or no
offline accept length, is listed as such and never chosen; exit 1 when none has one.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Trained:
    folder: str
    block: int
    distill: float
    depth_decay: float
    batch: int | None
    minutes: float
    steps: int | None                # the draft's optimiser steps (train.json; None from an older train_pair.py)
    chain: float                     # DFLASH's chain, offline accept length
    b32: float
    b64: float


def read_trained(folder: Path) -> Trained | str:
    """The folder's draft and its accept lengths, or why there are none."""
    path = folder / "pair" / "train.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"no train.json ({type(err).__name__})"
    drafts = {k: v for k, v in report.get("drafts", {}).items() if v.get("offline_accept")}
    if not drafts:
        return "no offline accept length (train_pair.py without --train-prompts, or an older train_pair.py)"
    name, draft = next(iter(drafts.items()))
    block = int(name[1:])
    accept = {a["tree"].split()[0]: a["accept_length"] for a in draft["offline_accept"]}
    return Trained(str(folder), block, report.get("distill", 0), report.get("depth_decay", 0), report.get("batch"),
                   report.get("minutes", 0), draft.get("steps"), accept["chain"],
                   accept["b32"], accept["b64"])


def best(found: list[Trained]) -> Trained:
    return max(found, key=lambda t: (t.chain, t.b64))


def table(rows: list[Trained | tuple[str, str]]) -> str:
    lines = ["| folder | block | distill | depth decay | batch | minutes | draft steps | DFLASH chain | b32 c8 "
             "| b64 c8 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if isinstance(r, Trained):
            lines.append(f"| {r.folder} | {r.block} | {r.distill:g} | {r.depth_decay:g} | {r.batch or '-'} | "
                         f"{r.minutes:g} | {r.steps or '-'} | {r.chain:.3f} | {r.b32:.3f} | {r.b64:.3f} |")
        else:
            lines.append(f"| {r[0]} | {r[1]} | | | | | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", help="SPEED_DIRs of speed_sweep.sh train runs")
    args = ap.parse_args(argv)
    rows: list[Trained | tuple[str, str]] = []
    for folder in args.folders:
        got = read_trained(Path(folder))
        rows.append(got if isinstance(got, Trained) else (folder, got))
    print(table(rows))
    found = [r for r in rows if isinstance(r, Trained)]
    if not found:
        print("best_draft.py: none of the folders has a draft with an offline accept length", file=sys.stderr)
        return 1
    chosen = best(found)
    print(f"best: DFLASH chain {chosen.chain:.3f}, b64 c8 {chosen.b64:.3f} (issue 45's bar for DFLASH: 4)")
    print(chosen.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
