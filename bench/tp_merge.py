"""Tensor-parallel DDTree candidates over NCCL: merged shards equal the unsharded tree, graphs replay.

Run on a machine with several GPUs (or one, world size 1):
    PYTHONPATH=src python3 -m bench.tp_merge [--world N] [--quick] [--out FILE]
    PYTHONPATH=src python3 -m bench.tp_merge --backend gloo --world 2 --quick   # CPU check of this script

One process per GPU (torch.multiprocessing, NCCL, rendezvous on 127.0.0.1). For every
(bs, L, budget) with vocabulary 163,840 sharded evenly over the ranks and top-k cap 8, every rank
draws the same full bf16 draft logits from one seed, keeps its shard, and runs
ddtree.tp.tp_candidates (local top-k + log-normaliser, one all-gather, identical merge) and
build_tree_from_candidates; on GPUs once with the fused Triton shard kernels and once with the
plain-torch shard path (column "shard top-k"). Checks, on every rank: the merged candidates and the tree equal the
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
    shard: str                # the local top-k + log-normaliser: 'triton' (fused kernels) or 'torch'
    bs: int
    depth: int
    budget: int
    equal_unsharded: bool     # every rank: candidates and tree == unsharded
    graph_exact: bool | None  # every rank: graph replay == eager (None: gloo on CPUs, no graphs)
    eager_ms: float           # rank 0: tp_candidates + build, eager
    graph_ms: float           # rank 0: the same, one graph replay
    gather_ms: float          # rank 0: the all-gather alone
    gather_bytes: int         # bytes each rank receives per step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configs(quick: bool, cuda: bool) -> list[tuple[str, int, int, int]]:
    """(shard path, bs, L, budget); on CPUs (gloo) only the torch shard path."""
    shards = ["triton", "torch"] if cuda else ["torch"]
    batches = [1, 8] if quick else [1, 8, 32, 64]
    depths = [7] if quick else [7, 15]
    budgets = [32] if quick else [32, 128]
    return [(sh, bs, d, b) for sh in shards for bs in batches for d in depths for b in budgets]


def timed(fn, reps: int = 20, cuda: bool = True) -> float:
    """Mean ms per call: CUDA events (tree_build.time_ms) on a GPU, the host clock on CPUs."""
    if cuda:
        from bench.tree_build import time_ms

        return time_ms(fn, reps)
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def graph_matches_eager(step, fill):
    """Capture step() (tree_build.graph_of), replay it on fresh logits, compare with eager; -> (exact, graph)."""
    import torch
    from bench.tree_build import graph_of

    graph, (g_cand, g_tree) = graph_of(step)
    exact = True
    for seed in (1, 2):
        fill(seed)
        e_cand, e_tree = step()
        graph.replay()
        exact &= torch.equal(g_cand.tokens, e_cand.tokens) and torch.equal(g_tree.tokens, e_tree.tokens) and \
            torch.equal(g_tree.parents, e_tree.parents)
    return bool(exact), graph


def rank_main(rank: int, world: int, port: int, quick: bool, out_path: str, backend: str = "nccl") -> None:
    import torch
    import torch.distributed as dist

    from ddtree.tp import tp_candidates
    from ddtree.tree import build_tree_from_candidates, draft_candidates_torch

    cuda = backend == "nccl"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            **({"device_id": dev} if cuda else {}))
    vocab = VOCAB if cuda else VOCAB // 16            # CPU check: a smaller vocabulary, same code
    bounds = [vocab * r // world for r in range(world + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    rows = []
    for shard, bs, depth, budget in configs(quick, cuda):
        full = torch.empty(bs, depth, vocab, dtype=torch.bfloat16, device=dev)
        roots = torch.zeros(bs, dtype=torch.int64, device=dev)

        def fill(seed: int) -> None:
            g = torch.Generator(device=dev).manual_seed(seed)
            full.copy_(torch.randn(full.shape, generator=g, device=dev) * 3)
            roots.copy_(torch.randint(0, vocab, (bs,), generator=g, device=dev))

        def step():
            cand = tp_candidates(full[..., lo:hi], CAP, lo, backend=shard)
            return cand, build_tree_from_candidates(cand, roots, budget)  # the tree: Triton on CUDA

        fill(0)
        cand, tree = step()
        want_cand = draft_candidates_torch(full, CAP)
        want_tree = build_tree_from_candidates(want_cand, roots, budget)
        equal = (torch.equal(cand.tokens, want_cand.tokens) and torch.allclose(cand.logp, want_cand.logp, atol=1e-5)
                 and torch.equal(tree.tokens, want_tree.tokens) and torch.equal(tree.parents, want_tree.parents))
        exact, graph = graph_matches_eager(step, fill) if cuda else (None, None)
        packed = torch.zeros(bs, depth, 2 * CAP + 1, dtype=torch.float64, device=dev)
        parts = [torch.empty_like(packed) for _ in range(world)]
        row = Row(world=world, shard=shard, bs=bs, depth=depth, budget=budget, equal_unsharded=bool(equal), graph_exact=exact,
                  eager_ms=timed(step, cuda=cuda), graph_ms=timed(graph.replay) if cuda else float("nan"),
                  gather_ms=timed(lambda: dist.all_gather(parts, packed), cuda=cuda),
                  gather_bytes=world * packed.numel() * packed.element_size())
        # every rank's verdicts travel to rank 0 (an all-reduce of failures)
        flags = torch.tensor([int(not row.equal_unsharded), int(exact is False)], device=dev)
        dist.all_reduce(flags)
        row.equal_unsharded = bool(flags[0] == 0)
        if exact is not None:
            row.graph_exact = bool(flags[1] == 0)
        rows.append(row)
        del graph
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump([asdict(r) for r in rows], f)
    dist.destroy_process_group()


def table(rows: list[Row], header: str) -> str:
    lines = [header, "", "| world | shard top-k | bs | L | budget | = unsharded (all ranks) | graph = eager (all ranks) | "
             "eager ms | graph ms | all-gather ms | gathered bytes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.world} | {r.shard} | {r.bs} | {r.depth} | {r.budget} | {'yes' if r.equal_unsharded else 'NO'} | "
                     f"{ {True: 'yes', False: 'NO', None: 'n/a'}[r.graph_exact]} | {r.eager_ms:.3f} | {r.graph_ms:.3f} | {r.gather_ms:.3f} | "
                     f"{r.gather_bytes} |")
    return "\n".join(lines) + "\n"


def run(world: int, quick: bool, backend: str = "nccl") -> list[Row]:
    import tempfile

    import torch.multiprocessing as mp

    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(rank_main, args=(world, free_port(), quick, out, backend), nprocs=world, join=True)
        with open(out) as f:
            return [Row(**r) for r in json.load(f)]


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=None, help="ranks (default: every visible GPU)")
    ap.add_argument("--quick", action="store_true", help="bs 1, 8; L 7; budget 32")
    ap.add_argument("--out", help="write the table here")
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl", help="gloo: a CPU check of the script")
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count()
    world = args.world or gpus
    if args.backend == "nccl" and not 1 <= world <= gpus:
        print(f"--world {world} is invalid: {gpus} GPU(s) visible", file=sys.stderr)
        return 2
    if world < 1:
        print(f"--world {world} is invalid: expected >= 1", file=sys.stderr)
        return 2
    rows = run(world, args.quick, args.backend)
    where = (f"{world} x {torch.cuda.get_device_name()}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
             if args.backend == "nccl" else f"{world} CPU processes, gloo, vocabulary {VOCAB // 16}")
    header = (f"{time.strftime('%Y-%m-%d')}, {where}, torch {torch.__version__}; vocabulary {VOCAB} (NCCL) "
              f"sharded over {world} ranks, cap {CAP}")
    text = table(rows, header)
    print(text)
    if args.out:
        open(args.out, "w").write(text)
    return 0 if all(r.equal_unsharded and r.graph_exact is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
