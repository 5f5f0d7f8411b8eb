"""Tensor-parallel candidates: merged shards equal the unsharded candidates and trees (gloo, CPU)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddtree.tp import merge_shards, shard_candidates, tp_candidates
from ddtree.tree import build_tree_from_candidates, draft_candidates_torch



def make_logits(bs=3, depth=4, vocab=1000, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, depth, vocab, generator=g) * 3
    if vocab > 900:
        x[..., 17] = x[..., 900]  # a tie across shards: the smaller id must win on every rank
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_merged_shards_equal_unsharded_candidates(world):
    x = make_logits()
    k = 8
    bounds = torch.linspace(0, x.shape[-1], world + 1).long().tolist()
    shards = [shard_candidates(x[..., a:b], k, a) for a, b in zip(bounds, bounds[1:])]
    merged = merge_shards(torch.stack([s.logits for s in shards]), torch.stack([s.ids for s in shards]),
                          torch.stack([s.log_z for s in shards]), k)
    want = draft_candidates_torch(x, k)
    assert torch.equal(merged.tokens, want.tokens)
    assert torch.allclose(merged.logp, want.logp, atol=1e-5)


def test_narrow_shards_pad_with_impossible_candidates():
    x = make_logits(vocab=12)
    shards = [shard_candidates(x[..., a:a + 3], 8, a) for a in range(0, 12, 3)]
    merged = merge_shards(torch.stack([s.logits for s in shards]), torch.stack([s.ids for s in shards]),
                          torch.stack([s.log_z for s in shards]), 8)
    assert torch.equal(merged.tokens, draft_candidates_torch(x, 8).tokens)


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x = make_logits(bs=2, depth=5, vocab=163_840 // 64)  # every rank builds the same full logits
        bounds = torch.linspace(0, x.shape[-1], world + 1).long().tolist()
        cand = tp_candidates(x[..., bounds[rank]:bounds[rank + 1]], 8, bounds[rank])
        tree = build_tree_from_candidates(cand, torch.tensor([1, 2]), 32)
        torch.save((cand.tokens, cand.logp, tree.tokens, tree.parents), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_agree_with_the_unsharded_tree(world, tmp_path):
    mp.spawn(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    x = make_logits(bs=2, depth=5, vocab=163_840 // 64)
    want = draft_candidates_torch(x, 8)
    want_tree = build_tree_from_candidates(want, torch.tensor([1, 2]), 32)
    for rank in range(world):
        tokens, logp, tree_tokens, parents = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(tokens, want.tokens)
        assert torch.allclose(logp, want.logp, atol=1e-5)
        assert torch.equal(tree_tokens, want_tree.tokens) and torch.equal(parents, want_tree.parents)


def test_the_nccl_benchmark_script_checks_out_with_gloo_on_cpus():
    """bench/tp_merge.py's own logic (shards, merge, build, the rank-0 verdict) with gloo, so the
    multi-GPU run it exists for does not fail on the script itself."""
    from bench import tp_merge
    rows = tp_merge.run(2, quick=True, backend="gloo")
    assert len(rows) == len(tp_merge.configs(True, cuda=False))
    assert all(r.equal_unsharded and r.graph_exact is None and r.gather_bytes > 0 for r in rows)
    assert "| 2 | torch | 1 | 7 | 32 | yes | n/a |" in tp_merge.table(rows, "h")


def _padded_head_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from ddtree.tp import vocab_parallel_candidates

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(1)
        hidden = torch.randn(2, 3, 16, generator=g)
        weight = torch.randn(1000, 16, generator=g)                  # the real vocabulary: 1000 tokens
        per_rank = 512                                               # shards padded to 512 rows each
        start = rank * per_rank
        num_org = max(0, min(per_rank, 1000 - start))
        shard = torch.full((per_rank, 16), 50.0)                     # padding rows: huge logits if counted
        shard[:num_org] = weight[start:start + num_org]
        cand = vocab_parallel_candidates(hidden, shard, start, num_org, 8)
        torch.save((cand.tokens, cand.logp), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_padded_vocab_parallel_head_gives_the_unsharded_candidates(tmp_path):
    mp.spawn(_padded_head_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3, 16, generator=g)
    weight = torch.randn(1000, 16, generator=g)
    want = draft_candidates_torch(hidden @ weight.t(), 8)
    for rank in range(2):
        tokens, logp = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(tokens, want.tokens)
        assert torch.allclose(logp, want.logp, atol=1e-5)
