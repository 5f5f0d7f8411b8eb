"""A trained speed pair's offline accept lengths on the speed sweep's 1-request prompts, counted on this machine
(train_pair.offline_accepts; float32 on the CPU came within 0.05 of SGLang's server on 2026-12-05's pair) and written
into the pair's train.json: a draft snapshot brought back from a machine taken back mid-training (speed_sweep.sh
snapshot, put over its pair by put_draft.sh) carries none, and training/best_draft.py ranks only drafts that have them.

    PYTHONPATH=src python3 -m training.offline_accept SPEED_DIR... [--prompts 24] [--tokens 192] [--budgets 32,64]

--budgets: the DDTREE trees (cap 8) counted beside DFLASH's chain; wider ones (128, 256) before a sweep tell which
widths are worth its servers (best_draft.py ranks by the chain and b64, so keep 32 and 64 among them).

SPEED_DIR: a folder holding pair/ (train.json, heldout_prompts.json, train_prompts.json, bN/target + bN/draft), as
speed_sweep.sh train leaves it or put_draft.sh's parts unpack. About 3 minutes a draft on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from training import train_pair

from ddtree.settings import MAX_BUDGET


def pair_files(folder: Path) -> tuple[dict, list[list[int]], list[list[int]], list[Path]]:
    """train.json, the held-out and training-file prompts, and the bN folders that hold a target and a draft; a
    SystemExit naming what is missing."""
    pair = folder / "pair"
    need = [pair / name for name in ("train.json", "heldout_prompts.json", "train_prompts.json")]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise SystemExit(f"offline_accept.py: {folder} is not a trained speed pair: {', '.join(missing)} missing "
                         "(give the SPEED_DIR speed_sweep.sh train used, or unpack put_draft.sh's parts into one)")
    blocks = sorted(d.parent for d in pair.glob("b*/draft/config.json") if (d.parent.parent / "target").is_dir())
    if not blocks:
        raise SystemExit(f"offline_accept.py: {pair} has no bN folder with both target/ and draft/ (a snapshot "
                         "alone has no target: put it over its pair with training/put_draft.sh first)")
    report, held, seen = (json.loads(p.read_text()) for p in need)
    return report, held, seen, [b.parent for b in blocks]


def judge(folder: Path, prompts: int, tokens: int, budgets: tuple[int, ...] = train_pair.ACCEPT_BUDGETS) -> dict:
    """Each draft's accept lengths into folder/pair/train.json (drafts.bN.offline_accept); the report written."""
    from ddtree.reference.pair import load_pair

    report, held, seen, blocks = pair_files(folder)
    on = train_pair.speed_prompts(held, seen, prompts)
    for block_dir in blocks:
        pair = load_pair(block_dir, device="cpu")
        pair.target.eval()
        pair.draft.eval()
        found = train_pair.offline_accepts(pair, on, tokens, budgets)
        report.setdefault("drafts", {}).setdefault(block_dir.name, {})["offline_accept"] = [asdict(a) for a in found]
        print(f"{folder} {block_dir.name}: {train_pair.accepts_line(found)}", flush=True)
    (folder / "pair" / "train.json").write_text(json.dumps(report, indent=1))
    return report


def budgets_arg(text: str) -> tuple[int, ...] | None:
    """'32,64,128' -> (32, 64, 128); None when a field is no tree budget of 2..MAX_BUDGET (the plugin's bound)."""
    try:
        budgets = tuple(int(b) for b in text.split(","))
    except ValueError:
        return None
    return budgets if all(2 <= b <= MAX_BUDGET for b in budgets) else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="SPEED_DIRs (each holding pair/)")
    ap.add_argument("--prompts", type=int, default=24, help="the sweep's first this many 1-request prompts")
    ap.add_argument("--tokens", type=int, default=192, help="new tokens per prompt")
    ap.add_argument("--budgets", default=",".join(map(str, train_pair.ACCEPT_BUDGETS)),
                    help="DDTREE budgets (cap 8) counted beside the chain, comma-separated")
    args = ap.parse_args(argv)
    budgets = budgets_arg(args.budgets)
    if budgets is None:
        ap.error(f"--budgets {args.budgets} is invalid: expected budgets from 2 to {MAX_BUDGET}, comma-separated, "
                 "e.g. 32,64,128")
    if args.prompts < 1 or args.tokens < 2:
        ap.error(f"--prompts {args.prompts} / --tokens {args.tokens} is invalid: expected at least 1 prompt and 2 "
                 "tokens (train_pair.py counts 24 x 192)")
    torch.set_grad_enabled(False)
    for folder in args.folders:
        judge(folder, args.prompts, args.tokens, budgets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
