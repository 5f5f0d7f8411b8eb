"""NCCL smoke test: one all-reduce across every visible GPU, bounded in time, sum checked.

    python -m ddtree.tools.nccl_smoke [--world-size N] [--timeout 120] [--log-dir DIR]

One process per GPU (torch.multiprocessing, rendezvous on 127.0.0.1), each contributes a 4 MiB
float32 tensor filled with rank + 1; after the all-reduce every element must be N (N + 1) / 2.
Then it times a few more all-reduces. Exit 0 and one summary line when every rank agrees; exit 1
with the reason, the ranks' errors and the tail of NCCL's own log (NCCL_DEBUG=INFO, written under
--log-dir) when a rank fails, the sum is wrong, or the collective does not finish within
--timeout (the classic PCIe peer-to-peer hang: check IOMMU / ACS, or set NCCL_P2P_DISABLE=1).
`--backend gloo` runs the same check on CPUs (tests, hosts without GPUs).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import queue
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

ELEMENTS = 1 << 20                      # 4 MiB of float32 per rank


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: float | None = None          # the all-reduced element (all equal) or None
    ms_per_allreduce: float | None = None
    error: str | None = None


@dataclass
class SmokeResult:
    ok: bool
    backend: str
    world_size: int
    expected: float
    ranks: list[RankResult]
    seconds: float
    reason: str = ""
    nccl_log_tail: str = ""

    def summary(self) -> str:
        if self.ok:
            ms = max(r.ms_per_allreduce or 0.0 for r in self.ranks)
            return (f"NCCL smoke OK: backend {self.backend}, world size {self.world_size}, sum {self.expected:g} on "
                    f"every rank, {ELEMENTS * 4 >> 20} MiB all-reduce {ms:.3f} ms, {self.seconds:.1f} s in all")
        return f"NCCL smoke FAILED ({self.backend}, world size {self.world_size}): {self.reason}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, backend: str, port: int, hang_rank: int, results) -> None:
    """One rank: init, all-reduce, check, time; the outcome goes to `results` (never raises)."""
    import datetime

    import torch
    import torch.distributed as dist

    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
        if rank == hang_rank:                    # TEST ONLY: never join the collective
            time.sleep(3600)
        x = torch.full((ELEMENTS,), float(rank + 1), device=device)
        dist.all_reduce(x)
        lo, hi = float(x.min()), float(x.max())
        start = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / 5 * 1e3
        results.put(RankResult(rank, ok=lo == hi, value=lo if lo == hi else None, ms_per_allreduce=ms,
                               error=None if lo == hi else f"elements differ: min {lo}, max {hi}"))
        dist.destroy_process_group()
    except Exception as err:                      # reported by the parent with the rank's number
        results.put(RankResult(rank, ok=False, error=f"{type(err).__name__}: {err}"))


def log_tail(log_dir: str, lines: int = 40) -> str:
    out = []
    for path in sorted(glob.glob(os.path.join(log_dir, "nccl.*.log"))):
        with open(path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
        out.append(f"== {os.path.basename(path)} ==\n" + "\n".join(tail))
    return "\n".join(out)


def run_smoke(world: int, backend: str = "nccl", timeout: float = 120.0, log_dir: str | None = None,
              hang_rank: int = -1) -> SmokeResult:
    import torch.multiprocessing as mp

    log_dir = log_dir or tempfile.mkdtemp(prefix="nccl-smoke-")
    os.makedirs(log_dir, exist_ok=True)
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_FILE", os.path.join(log_dir, "nccl.%h.%p.log"))
    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(name, value)
    expected = world * (world + 1) / 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    start = time.monotonic()
    procs = [ctx.Process(target=_rank_main, args=(r, world, backend, port, hang_rank, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, RankResult] = {}
    deadline = start + timeout
    while len(got) < world and time.monotonic() < deadline:
        try:
            r = results.get(timeout=0.5)
            got[r.rank] = r
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    timed_out = len(got) < world and time.monotonic() >= deadline
    for p in procs:                               # our own children only, by their PIDs
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    ranks = [got.get(r, RankResult(r, ok=False, error="no result (killed at the deadline)" if timed_out
                                   else "the process died without a result")) for r in range(world)]
    bad = [r for r in ranks if not r.ok or r.value != expected]
    reason = ""
    if timed_out:
        reason = (f"the all-reduce did not finish within {timeout:g} s on ranks {[r.rank for r in bad]}: a hang; on "
                  "PCIe hosts check IOMMU/ACS (docs) or set k26_nccl_p2p: false (NCCL_P2P_DISABLE=1)")
    elif bad:
        reason = "; ".join(f"rank {r.rank}: {r.error or f'sum {r.value} != {expected:g}'}" for r in bad)
    return SmokeResult(ok=not bad, backend=backend, world_size=world, expected=expected, ranks=ranks,
                       seconds=time.monotonic() - start, reason=reason,
                       nccl_log_tail=log_tail(log_dir) if bad and backend == "nccl" else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    ap.add_argument("--world-size", type=int, default=None, help="default: every visible GPU (nccl)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole smoke test")
    ap.add_argument("--log-dir", default=None, help="where NCCL writes its log (default: a new temp dir)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--test-hang-rank", type=int, default=-1, help=argparse.SUPPRESS)   # TEST ONLY
    args = ap.parse_args(argv)
    world = args.world_size
    if world is None:
        if args.backend == "gloo":
            ap.error("--backend gloo needs --world-size N")
        import torch

        world = torch.cuda.device_count()
        if world == 0:
            ap.error("no CUDA GPU is visible (CUDA_VISIBLE_DEVICES, driver): nothing to test; "
                     "use --backend gloo --world-size N to check the tool itself")
    if world < 1:
        ap.error(f"--world-size {world} is invalid: expected >= 1")
    if args.timeout <= 0:
        ap.error(f"--timeout {args.timeout} is invalid: expected seconds > 0")
    result = run_smoke(world, args.backend, args.timeout, args.log_dir, args.test_hang_rank)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(result.summary())
        if not result.ok:
            for r in result.ranks:
                print(f"  rank {r.rank}: {'ok' if r.ok else r.error}")
            if result.nccl_log_tail:
                print(result.nccl_log_tail)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
