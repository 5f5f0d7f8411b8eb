"""python -m ddtree.reference.init --out DIR --seed 0 [--preset tiny|small]

Writes a deterministic random-init target + draft pair and the tokenizer (same seed, same bytes).
"""

from __future__ import annotations

import argparse
import sys

from ddtree.reference.config import PRESETS
from ddtree.reference.pair import init_pair, save_pair


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree.reference.init", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory to write (target/ and draft/ inside)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    args = ap.parse_args(argv)
    target_cfg, draft_cfg = PRESETS[args.preset]
    save_pair(init_pair(target_cfg, draft_cfg, args.seed), args.out)
    print(f"wrote {args.preset} pair (seed {args.seed}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
