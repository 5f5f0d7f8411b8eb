"""The DDTREE draft head (ddtree.sglang.step.head) on the CPU: one rank and a vocabulary split over two."""

from __future__ import annotations

import threading

import pytest
import torch

from ddtree.sglang.step.head import DraftCandidateHead, HeadShard
from ddtree.tree import draft_candidates_torch

BLOCK, HIDDEN, VOCAB, K = 5, 16, 70, 4


def draft_hidden(bs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(bs * BLOCK, HIDDEN, generator=g), torch.randn(VOCAB, HIDDEN, generator=g)


def expected(hidden: torch.Tensor, weight: torch.Tensor):
    rows = hidden.view(-1, BLOCK, HIDDEN)[:, 1:]                       # depths 1..L; slot 0 is the bonus
    return draft_candidates_torch(rows @ weight.t(), K)


def test_one_rank_gives_the_full_vocabulary_candidates_of_depths_1_to_L():
    hidden, weight = draft_hidden(3)
    padded = torch.cat([weight, torch.full((10, HIDDEN), 50.0)])       # padding rows must never count
    head = DraftCandidateHead(HeadShard(weight=padded, num_org=VOCAB, vocab_start=0), K, BLOCK, max_bs=4)
    got, want = head.compute(hidden), expected(hidden, weight)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.allclose(got.logp, want.logp, atol=1e-5)


def test_the_capture_hook_fills_the_static_buffers_for_the_batch():
    hidden, weight = draft_hidden(2)
    head = DraftCandidateHead(HeadShard(weight=weight, num_org=VOCAB, vocab_start=0), K, BLOCK, max_bs=4)
    head(hidden, None)
    want = expected(hidden, weight)
    assert torch.equal(head.captured(2).tokens, want.tokens)
    assert torch.all(head.tokens[2:] == 0) and torch.all(head.logp[2:] == float("-inf"))


def test_two_ranks_merge_to_the_unsharded_candidates_through_one_gather():
    hidden, weight = draft_hidden(3, seed=1)
    cut = 33                                                            # uneven shards, like a padded vocab
    shards = [(weight[:cut], 0), (weight[cut:], cut)]
    inputs: list = [None, None]
    barrier = threading.Barrier(2)

    def gather_for(rank):
        def gather(out: torch.Tensor, inp: torch.Tensor) -> None:      # all_gather_into_tensor of 2 ranks
            inputs[rank] = inp.clone()
            barrier.wait()
            out.copy_(torch.cat(inputs))
            barrier.wait()
        return gather

    results: list = [None, None]

    def run(rank):
        w, start = shards[rank]
        rows = torch.cat([w, torch.zeros(7, HIDDEN)])                   # shard padded to an aligned size
        head = DraftCandidateHead(HeadShard(weight=rows, num_org=w.shape[0], vocab_start=start, world=2,
                                            gather=gather_for(rank)), K, BLOCK, max_bs=0)
        results[rank] = head.compute(hidden)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = expected(hidden, weight)
    for got in results:
        assert torch.equal(got.tokens, want.tokens)
        assert torch.allclose(got.logp, want.logp, atol=1e-5)


def test_several_ranks_without_a_gather_are_refused():
    _, weight = draft_hidden(1)
    with pytest.raises(ValueError, match="world=2 needs the TP group's all_gather_into_tensor"):
        DraftCandidateHead(HeadShard(weight=weight, num_org=VOCAB, vocab_start=0, world=2), K, BLOCK, max_bs=1)
