"""Tensor-parallel DDTree candidates over NCCL: merged shards equal the unsharded tree, graphs replay.

Run on a machine with several GPUs (or one, world size 1):
    PYTHONPATH=src python3 bench/tp_merge.py [--world N] [--quick] [--out FILE]

One process per GPU (torch.multiprocessing, NCCL, rendezvous on 127.0.0.1). For every
(bs, L, budget) with vocabulary 163,840 sharded evenly over the ranks and top-k cap 8, every rank
draws the same full bf16 draft logits from one seed, keeps its shard, and runs
ddtree.tp.tp_candidates (local top-k + log-normaliser, one all-gather, identical merge) and
build_tree_from_candidates. Checks, on every rank: the merged candidates and the tree equal the
unsharded draft_candidates + tree; the same merge + build captured in a CUDA graph and replayed
on fresh logits gives the eager result. Times (rank 0, CUDA events): eager and graph-replay
step, and the all-gather alone; bytes gathered per step. Prints a markdown table.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass

VOCAB = 163_840
CAP = 8


@dataclass
class Row:
    world: int
    bs: int
    depth: int
    budget: int
    equal_unsharded: bool     # every rank: candidates and tree == unsharded
    graph_exact: bool         # every rank: graph replay == eager
    eager_ms: float           # rank 0: tp_candidates + build, eager
    graph_ms: float           # rank 0: the same, one graph replay
    gather_ms: float          # rank 0: the all-gather alone
    gather_bytes: int         # bytes each rank receives per step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configs(quick: bool) -> list[tuple[int, int, int]]:
    batches = [1, 8] if quick else [1, 8, 32, 64]
    depths = [7] if quick else [7, 15]
    budgets = [32] if quick else [32, 128]
    return [(bs, d, b) for bs in batches for d in depths for b in budgets]


def timed(fn, reps: int = 20) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def rank_main(rank: int, world: int, port: int, quick: bool, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from ddtree.tp import tp_candidates
    from ddtree.tree import build_tree_from_candidates, draft_candidates_torch

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    dev = torch.device("cuda", rank)
    bounds = [VOCAB * r // world for r in range(world + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    rows = []
    for bs, depth, budget in configs(quick):
        full = torch.empty(bs, depth, VOCAB, dtype=torch.bfloat16, device=dev)
        roots = torch.zeros(bs, dtype=torch.int64, device=dev)

        def fill(seed: int) -> None:
            g = torch.Generator(device=dev).manual_seed(seed)
            full.copy_(torch.randn(full.shape, generator=g, device=dev) * 3)
            roots.copy_(torch.randint(0, VOCAB, (bs,), generator=g, device=dev))

        def step():
            cand = tp_candidates(full[..., lo:hi], CAP, lo)
            return cand, build_tree_from_candidates(cand, roots, budget)

        def unsharded():
            cand = draft_candidates_torch(full, CAP)
            return cand, build_tree_from_candidates(cand, roots, budget)

        fill(0)
        cand, tree = step()
        want_cand, want_tree = unsharded()
        equal = (torch.equal(cand.tokens, want_cand.tokens) and torch.allclose(cand.logp, want_cand.logp, atol=1e-5)
                 and torch.equal(tree.tokens, want_tree.tokens) and torch.equal(tree.parents, want_tree.parents))
        # graph: warm up on a side stream, capture, replay on new logits, compare with eager
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_cand, g_tree = step()
        exact = True
        for seed in (1, 2):
            fill(seed)
            e_cand, e_tree = step()
            graph.replay()
            exact &= torch.equal(g_cand.tokens, e_cand.tokens) and torch.equal(g_tree.tokens, e_tree.tokens) and \
                torch.equal(g_tree.parents, e_tree.parents)
        packed = torch.zeros(bs, depth, 2 * CAP + 1, dtype=torch.float64, device=dev)
        parts = [torch.empty_like(packed) for _ in range(world)]
        row = Row(world=world, bs=bs, depth=depth, budget=budget, equal_unsharded=bool(equal), graph_exact=bool(exact),
                  eager_ms=timed(step), graph_ms=timed(graph.replay),
                  gather_ms=timed(lambda: dist.all_gather(parts, packed)),
                  gather_bytes=world * packed.numel() * packed.element_size())
        # every rank's verdicts travel to rank 0 (an all-reduce of failures)
        flags = torch.tensor([int(not row.equal_unsharded), int(not row.graph_exact)], device=dev)
        dist.all_reduce(flags)
        row.equal_unsharded, row.graph_exact = bool(flags[0] == 0), bool(flags[1] == 0)
        rows.append(row)
        del graph
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump([asdict(r) for r in rows], f)
    dist.destroy_process_group()


def table(rows: list[Row], header: str) -> str:
    lines = [header, "", "| world | bs | L | budget | = unsharded (all ranks) | graph = eager (all ranks) | eager ms | "
             "graph ms | all-gather ms | gathered bytes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.world} | {r.bs} | {r.depth} | {r.budget} | {'yes' if r.equal_unsharded else 'NO'} | "
                     f"{'yes' if r.graph_exact else 'NO'} | {r.eager_ms:.3f} | {r.graph_ms:.3f} | {r.gather_ms:.3f} | "
                     f"{r.gather_bytes} |")
    return "\n".join(lines) + "\n"


def run(world: int, quick: bool) -> list[Row]:
    import tempfile

    import torch.multiprocessing as mp

    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(rank_main, args=(world, free_port(), quick, out), nprocs=world, join=True)
        with open(out) as f:
            return [Row(**r) for r in json.load(f)]


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=None, help="ranks (default: every visible GPU)")
    ap.add_argument("--quick", action="store_true", help="bs 1, 8; L 7; budget 32")
    ap.add_argument("--out", help="write the table here")
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count()
    world = args.world or gpus
    if not 1 <= world <= gpus:
        print(f"--world {world} is invalid: {gpus} GPU(s) visible", file=sys.stderr)
        return 2
    rows = run(world, args.quick)
    header = (f"{time.strftime('%Y-%m-%d')}, {world} x {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; vocabulary {VOCAB} over {world} ranks, cap {CAP}")
    text = table(rows, header)
    print(text)
    if args.out:
        open(args.out, "w").write(text)
    return 0 if all(r.equal_unsharded and r.graph_exact for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
