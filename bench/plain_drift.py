"""How far SGLang's own paths move from plain one-at-a-time decoding on a pair (temperature 0), without DDTREE:
NONE with 8 requests at once, and DFLASH one at a time, each compared with NONE one at a time as the GPU tests
compare DDTREE (identical, or where they part: plain decoding's own top-2 gap there). A bf16 MoE target's
routing and kernels change with the batch's shape; this measures by how much, so a DDTREE difference of the
same size is read against it. Prints a table; writes plain_drift.json to --out.

    python3 -m bench.plain_drift --pair DIR --prompts heldout_prompts.json --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testbed import servers as harness


def top_gap(top: dict[int, float]) -> float:
    first, second = sorted(top.values(), reverse=True)[:2]
    return first - second


def gaps_where_parted(plain, prompts, want, have) -> list[float]:
    """Plain decoding's top-2 gap at the first token where each output parts from `want` (none if identical)."""
    out = []
    for p, w, h in zip(prompts, want, have):
        at = harness.first_divergence(w, h)
        if at is not None and at < len(h):
            out.append(round(top_gap(plain.next_top(p + h[:at])), 5))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    raw = json.loads(args.prompts.read_text())
    prompts = [p[: 1 + 16 + 15 * i] for i, p in enumerate(raw[:16])]
    fleet = harness.Fleet(args.pair, args.out / "logs", base_port=16000)
    try:
        ready = fleet.start(["none", "dflash"], args.timeout)
        none = fleet.get("none")
        want = [a["output_ids"] for a in none.complete_all(prompts, harness.greedy(), 1)]
        rows = []
        for label, server, concurrency in (("NONE, 8 at once", none, 8), ("NONE, 16 at once", none, 16),
                                           ("DFLASH, one at a time", fleet.get("dflash"), 1)):
            if not ready.get(server.config.name):
                rows.append({"path": label, "error": server.exit_message()})
                continue
            have = [a["output_ids"] for a in server.complete_all(prompts, harness.greedy(), concurrency)]
            gaps = gaps_where_parted(none, prompts, want, have)
            rows.append({"path": label, "identical": f"{sum(a == b for a, b in zip(want, have))}/{len(prompts)}",
                         "plain top-2 gaps where it parts": gaps})
    finally:
        fleet.stop_all()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plain_drift.json").write_text(json.dumps(rows, indent=1))
    print("| path | identical to NONE one at a time | NONE's top-2 gap where it parts |\n|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r.get('identical', r.get('error'))} | {r.get('plain top-2 gaps where it parts', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
