"""CPU tokens/s of the reference engine: ar vs dflash chain vs ddtree, random-init presets.

Run: PYTHONPATH=src python3 -m bench.reference_cpu   (or the test venv's python after make venv)
A random pair accepts almost nothing, so these numbers show the overhead of drafting and
verifying a tree on the CPU, not a speed-up.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from ddtree.reference import generate, init_pair
from ddtree.reference.config import PRESETS


def run(pair, method: str, bs: int, new_tokens: int, budget: int, cap: int, repeats: int) -> tuple[float, float]:
    """(tokens/s, tokens per verify step) for a batch of bs prompts, median over repeats."""
    prompts = [pair.tokenizer.encode(f"def function_{i}(x):\n    return") for i in range(bs)]
    rates, per_step = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = generate(pair, prompts, max_new_tokens=new_tokens, method=method, budget=budget, topk_cap=cap)
        dt = time.perf_counter() - t0
        tokens = sum(len(o.tokens) for o in out)
        rates.append(tokens / dt)
        per_step.append(tokens / sum(o.num_verify_steps for o in out))
    return statistics.median(rates), statistics.median(per_step)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"CPU {platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}, "
          f"float32, {args.new_tokens} new tokens, {time.strftime('%Y-%m-%d', time.gmtime())}\n")
    print("| preset | bs | method | budget | cap | tokens/s | tokens per verify step |")
    print("|---|---|---|---|---|---|---|")
    for preset in ("tiny", "small"):
        pair = init_pair(*PRESETS[preset], seed=0)
        for bs in (1, 8):
            for method, budget, cap in (("ar", 0, 0), ("dflash", 0, 0), ("ddtree", 8, 4), ("ddtree", 32, 8)):
                rate, step = run(pair, method, bs, args.new_tokens, budget or 1, cap or 1, args.repeats)
                shown = (str(budget), str(cap)) if method == "ddtree" else ("-", "-")
                print(f"| {preset} | {bs} | {method} | {shown[0]} | {shown[1]} | {rate:.0f} | {step:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
