"""TargetLM.greedy_continue (the cached greedy decode train_pair's distillation and offline accept check use): the
same tokens as an uncached argmax loop over forward_sequence and as the engine's plain decoding, on the dense and
the Kimi-shaped (MLA + MoE) targets, several rows of one prefix length at once (float64 on the CPU)."""

from __future__ import annotations

import pytest
import torch

from ddtree.reference import generate
from ddtree.reference.pair import init_pair

from .conftest import kimi_shaped_configs, small_vocab_pair


def uncached_greedy(target, prefix: torch.Tensor, new_tokens: int) -> torch.Tensor:
    seq = prefix
    for _ in range(new_tokens):
        seq = torch.cat([seq, target.forward_sequence(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


@pytest.fixture(scope="module", params=["dense", "kimi"])
def pair(request):
    if request.param == "dense":
        return small_vocab_pair(vocab=32, seed=3, std=0.3)
    pair = init_pair(*kimi_shaped_configs(), seed=11, std=0.08)
    pair.target.double()
    pair.draft.double()
    return pair


def test_cached_greedy_equals_the_uncached_argmax_loop(pair):
    target = pair.target
    vocab = target.config.vocab_size
    prefix = torch.randint(2, vocab - 2, (3, 9), generator=torch.Generator().manual_seed(0))     # [3, 9]
    with torch.no_grad():
        want = uncached_greedy(target, prefix, 12)
    got = target.greedy_continue(prefix, 12)
    assert got.shape == (3, 21) and torch.equal(got[:, :9], prefix)
    assert torch.equal(got, want)
    assert len({tuple(r) for r in got[:, 9:].tolist()}) > 1          # the rows decode apart: no row copied to all


def test_cached_greedy_equals_the_engines_plain_decoding(pair):
    """The engine stops at EOS: its tokens are the cached decode's first ones."""
    prompt = [pair.target.config.bos_token_id, 5, 9, 14, 3, 7]
    engine = generate(pair, [prompt], max_new_tokens=10, method="ar")[0].tokens
    assert engine and pair.target.greedy_continue(torch.tensor([prompt]), 10)[0, len(prompt):].tolist()[:len(engine)] \
        == engine
