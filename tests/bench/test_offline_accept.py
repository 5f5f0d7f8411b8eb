"""train_pair.offline_accepts: the accept length a draft is judged by before SGLang is staged (completion tokens /
verify steps per prompt, SGLang's spec_accept_length, then the mean) counts what the reference engine's own decoding
does, step for step, on the same prompts (float64 on the CPU, where both are exact)."""

from __future__ import annotations

import pytest

from ddtree.reference import generate
from tests.reference.conftest import small_vocab_pair


@pytest.fixture(scope="module")
def pair():
    return small_vocab_pair(vocab=6, seed=5, std=0.25, block_size=4)


def engine_accept(pair, prompts, new_tokens, budget, cap, method):
    """SGLang's count from the engine: SGLang's prefill gives the first token (the engine's first step does), and
    its verify steps, rooted at that token, emit the rest: the engine decoding prompt + first token."""
    first = [g.tokens[0] for g in generate(pair, prompts, max_new_tokens=1, method="ar")]
    out = generate(pair, [p + [t] for p, t in zip(prompts, first)], max_new_tokens=new_tokens - 1, method=method,
                   budget=budget, topk_cap=cap)
    assert all(len(g.tokens) == new_tokens - 1 for g in out), "a prompt stopped early: choose one without EOS"
    per = [new_tokens / g.num_verify_steps for g in out]
    return sum(per) / len(per), per


def test_offline_accept_equals_the_engines_own_steps(pair):
    from training import train_pair
    prompts = [[0, 2, 3, 4, 2], [0, 3], [0, 4, 4, 2, 3, 5, 2], [0, 5, 3]]      # seen, held-out, seen, held-out
    found = {a.tree: a for a in train_pair.offline_accepts(pair, prompts, 20)}
    assert list(found) == ["chain b3 c1", "b32 c8", "b64 c8"]
    chain, per = engine_accept(pair, prompts, 20, 3, 1, "dflash")
    assert found["chain b3 c1"].accept_length == pytest.approx(chain, rel=1e-12)
    assert found["chain b3 c1"].seen == pytest.approx((per[0] + per[2]) / 2, rel=1e-12)
    assert found["chain b3 c1"].heldout == pytest.approx((per[1] + per[3]) / 2, rel=1e-12)
    tree, _ = engine_accept(pair, prompts, 20, 32, 8, "ddtree")
    assert found["b32 c8"].accept_length == pytest.approx(tree, rel=1e-12)
    assert 1.0 < chain < found["b32 c8"].accept_length <= 4      # a tree accepts more; at most the block per step
