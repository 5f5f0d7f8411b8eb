"""Device time of build_tree + verify_tree per decode step, against the reference algorithm.

Run on a CUDA GPU (the lent H200):  PYTHONPATH=src python3 -m bench.tree_build [--bs 1 8] [--depths 7]
[--budgets 32] [--iters 30] [--out FILE] (a short run: fewer sizes and iterations)

For every (bs, L, budget, topk_cap) it times, with V = 163,840 bf16 logits:
  - eager: build_tree, and build_tree + verify_tree (greedy), launched from Python each step;
  - graph: the same captured in a CUDA graph and replayed (the replay's outputs are compared
    with the eager outputs for identity);
  - reference: the public reference algorithm's structure (GPU top-k + log-softmax of one
    request, copy to the host, best-first heap in Python, visibility matrix in numpy), one
    request at a time, times bs;
  - floor: reading the draft and target logits once at the measured copy bandwidth.
Prints a markdown table (and writes it with --out).
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from ddtree import build_tree, verify_tree

VOCAB = 163_840


@dataclass
class Row:
    bs: int
    depth: int
    budget: int
    cap: int
    build_eager_ms: float
    step_eager_ms: float
    build_graph_ms: float
    step_graph_ms: float
    reference_ms: float
    floor_us: float
    identical: bool


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy bandwidth, counting bytes read plus written (GB/s)."""
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    del src, dst
    return 2 * 2 * 1024**3 / seconds / 1e9


def time_ms(fn, iters: int) -> float:
    """Mean device time per call over `iters` calls after warm-up (CUDA events)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def reference_build(draft_row: torch.Tensor, budget: int) -> tuple[list, np.ndarray]:
    """The reference structure for ONE request: draft_row [L, V] on the GPU."""
    depth, vocab = draft_row.shape
    k = min(budget, vocab)
    top = torch.log_softmax(draft_row.float(), dim=-1).topk(k, dim=-1)
    vals = top.values.cpu().numpy()   # host copy (synchronises)
    toks = top.indices.cpu().numpy()
    heap = [(-float(vals[0, 0]), (0,))]
    nodes: list[tuple[int, ...]] = []
    while heap and len(nodes) < budget:
        neg, ranks = heapq.heappop(heap)
        nodes.append(ranks)
        d, r = len(ranks), ranks[-1]
        if r + 1 < k:
            heapq.heappush(heap, (neg + float(vals[d - 1, r]) - float(vals[d - 1, r + 1]), ranks[:-1] + (r + 1,)))
        if d < depth:
            heapq.heappush(heap, (neg - float(vals[d, 0]), ranks + (0,)))
    index = {ranks: i + 1 for i, ranks in enumerate(nodes)}
    visible = np.eye(len(nodes) + 1, dtype=bool)
    visible[:, 0] = True
    tokens = []
    for i, ranks in enumerate(nodes, start=1):
        parent = index.get(ranks[:-1], 0)
        visible[i] |= visible[parent]
        tokens.append(int(toks[len(ranks) - 1, ranks[-1]]))
    return tokens, visible


def reference_ms(draft: torch.Tensor, budget: int, calls: int = 7) -> float:
    """Median host-clock time of the reference build of request 0, times bs (one by one)."""
    times = []
    for _ in range(calls + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        reference_build(draft[0], budget)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[2:]) * draft.shape[0]


def graph_of(fn):
    """Capture fn() in a CUDA graph after warm-up on a side stream; returns (graph, outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def bench_one(bs: int, depth: int, budget: int, cap: int, iters: int, bw: float,
              target_pool: torch.Tensor) -> Row:
    g = torch.Generator(device="cuda").manual_seed(bs * 7919 + depth * 31 + budget)
    draft = (torch.randn(bs, depth, VOCAB, device="cuda", generator=g) * 3).to(torch.bfloat16)
    roots = torch.randint(0, VOCAB, (bs,), device="cuda", generator=g)
    n = budget + 1
    target = target_pool[: bs * n * VOCAB].view(bs, n, VOCAB)

    def build():
        return build_tree(draft, roots, budget=budget, topk_cap=cap)

    def step():
        tree = build()
        verdict = verify_tree(tree, target, 0.0)
        return tree, verdict

    build_eager = time_ms(build, iters)
    step_eager = time_ms(step, iters)
    want_tree, want_verdict = step()
    g_build, _ = graph_of(build)
    build_graph = time_ms(g_build.replay, iters)
    g_step, (tree, verdict) = graph_of(step)
    step_graph = time_ms(g_step.replay, iters)
    identical = all(torch.equal(getattr(tree, f), getattr(want_tree, f))
                    for f in ("tokens", "parents", "depths", "num_nodes", "ancestor_mask"))
    identical &= all(torch.equal(getattr(verdict, f), getattr(want_verdict, f))
                     for f in ("accepted", "accept_len", "bonus", "tokens"))
    ref = reference_ms(draft, budget)
    floor_us = (draft.numel() + target.numel()) * 2 / (bw * 1e9) * 1e6
    del g_build, g_step
    return Row(bs, depth, budget, cap, build_eager, step_eager, build_graph, step_graph, ref, floor_us, identical)


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "",
             "| bs | L | budget | cap | build eager (ms) | build+verify eager (ms) | build graph (ms) "
             "| build+verify graph (ms) | reference build, one by one (ms) | speed-up (ref / graph build) "
             "| floor: read logits once (us) | graph == eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.bs} | {r.depth} | {r.budget} | {r.cap} | {r.build_eager_ms:.3f} | {r.step_eager_ms:.3f} "
                     f"| {r.build_graph_ms:.3f} | {r.step_graph_ms:.3f} | {r.reference_ms:.2f} "
                     f"| {r.reference_ms / r.build_graph_ms:.0f}x | {r.floor_us:.1f} | {'yes' if r.identical else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--depths", type=int, nargs="+", default=[7, 15])
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", help="write the markdown table here too")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/tree_build.py needs a CUDA GPU", file=sys.stderr)
        return 2
    bw = copy_bandwidth_gbs()
    props = torch.cuda.get_device_properties(0)
    import triton

    header = (f"GPU {props.name}, torch {torch.__version__}, triton {triton.__version__}, "
              f"V={VOCAB}, bf16 logits, copy bandwidth {bw:.0f} GB/s, "
              f"{time.strftime('%Y-%m-%d', time.gmtime())}")
    print(header, flush=True)
    pool = torch.randn(max(args.bs) * (max(args.budgets) + 1) * VOCAB, device="cuda").to(torch.bfloat16)
    rows = []
    for depth in args.depths:
        for budget in args.budgets:
            for cap in sorted({8, budget}):
                for bs in args.bs:
                    row = bench_one(bs, depth, budget, cap, args.iters, bw, pool)
                    rows.append(row)
                    print(markdown([row], "").splitlines()[-1], flush=True)
    table = markdown(rows, header)
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(table)
    return 0 if all(r.identical for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
