"""The top-2-of-8 statistical rule of the GPU tests (tests/gpu_sglang/partings.py) on the CPU: the walk of an answer
against a small deterministic plain decoder, and the three one-sided tests against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from tests.gpu_sglang.partings import (ALPHA, AnswerWalk, PlainModel, Tally, compare, gaps_pvalue, rate_pvalue,
                                       walk_answer)
from tests.gpu_sglang.referee import Parting

VOCAB = 11


def plain_top(context: list[int]) -> dict[int, float]:
    """A fixed plain decoder: its best token is (3 x sum + 1) mod 11, the next one 0.03 below (a near tie) when the
    sum is even, else 0.5 below; every other token far below."""
    best = (3 * sum(context) + 1) % VOCAB
    second = (best + 1) % VOCAB
    return {best: -0.2, second: -0.23 if sum(context) % 2 == 0 else -0.7, (best + 2) % VOCAB: -4.0}


def continue_greedy(context: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        top = plain_top(context + out)
        out.append(max(top, key=top.get))
    return out


def float32_says(token_of: dict[int, int]):
    """A float32 referee whose argmax after a context of length L is token_of[L] (else token 0)."""
    def logprobs(context: list[int]) -> torch.Tensor:
        out = torch.full((VOCAB,), -20.0)
        out[token_of.get(len(context), 0)] = -0.1
        return out
    return logprobs


PROMPT = [1, 2, 3]
PLAIN = PlainModel(plain_top, continue_greedy)


def diverge(answer_len: int, at: dict[int, int]) -> list[int]:
    """A speculative answer: plain decoding's, but at each position p in `at` the token at[p] (offset from plain's
    best), plain decoding re-anchored after it."""
    have: list[int] = []
    while len(have) < answer_len:
        top = plain_top(PROMPT + have)
        best = max(top, key=top.get)
        have.append((best + at[len(have)]) % VOCAB if len(have) in at else best)
    return have


def test_an_identical_answer_has_no_parting():
    want = continue_greedy(PROMPT, 40)
    walk = walk_answer(PLAIN, PROMPT, want, list(want))
    assert walk == AnswerWalk(tokens=40, partings=[])


def test_every_parting_is_judged_and_the_walk_goes_on_past_a_real_difference():
    want = continue_greedy(PROMPT, 40)
    have = diverge(40, {5: 1, 17: 2, 30: 1})
    walk = walk_answer(PLAIN, PROMPT, want, have)
    assert [p.position for p in walk.partings] == [5, 17, 30]
    assert walk.tokens == 40
    kinds = [p.kind for p in walk.partings]
    # the second token (offset 1) is a near tie only where the context's sum is even; offset 2 is 3.8 below
    for p, kind in zip(walk.partings, kinds):
        top = plain_top(PROMPT + have[:p.position])
        assert p.bf16_gap == pytest.approx(max(top.values()) - top[p.taken_token])
        assert kind == ("near tie" if p.bf16_gap <= 0.0625 else "real difference")
    assert kinds[1] == "real difference"


def test_the_float32_referee_clears_a_parting_it_would_take_itself():
    want = continue_greedy(PROMPT, 20)
    have = diverge(20, {7: 2})
    referee = float32_says({len(PROMPT) + 7: have[7]})
    walk = walk_answer(PlainModel(plain_top, continue_greedy, referee), PROMPT, want, have)
    assert [(p.position, p.kind) for p in walk.partings] == [(7, "exact")]
    walk = walk_answer(PlainModel(plain_top, continue_greedy, float32_says({})), PROMPT, want, have)
    assert [p.kind for p in walk.partings] == ["real difference"]


def test_the_walk_stops_at_its_limit_and_counts_tokens_to_there():
    want = continue_greedy(PROMPT, 60)
    have = diverge(60, {i: 2 for i in range(2, 60, 4)})
    walk = walk_answer(PLAIN, PROMPT, want, have, limit=5)
    assert [p.position for p in walk.partings] == [2, 6, 10, 14, 18]
    assert walk.tokens == 19


def test_a_plain_answer_that_ends_early_counts_as_a_parting_at_its_end():
    have = continue_greedy(PROMPT, 30)
    walk = walk_answer(PLAIN, PROMPT, have[:20], have)
    assert [(p.position, p.kind, p.bf16_gap) for p in walk.partings] == [(20, "near tie", 0.0)]
    assert walk.tokens == 30


def binomial_tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize("k_tree,n_tree,k_control,n_control", [(10, 1000, 10, 1000), (40, 1000, 10, 1000),
                                                               (3, 500, 9, 1500), (0, 800, 5, 800)])
def test_the_rate_test_is_the_exact_conditional_binomial_tail(k_tree, n_tree, k_control, n_control):
    want = binomial_tail(k_tree, k_tree + k_control, n_tree / (n_tree + n_control))
    assert rate_pvalue(k_tree, n_tree, k_control, n_control) == pytest.approx(want, rel=1e-9)


def test_the_rate_test_without_any_event_cannot_reject_and_refuses_empty_counts():
    assert rate_pvalue(0, 100, 0, 100) == 1.0
    with pytest.raises(ValueError, match="token counts must be positive: tree 0"):
        rate_pvalue(1, 0, 1, 100)


def test_the_gap_test_rejects_only_larger_gaps():
    small, large = [0.01, 0.02, 0.03, 0.05, 0.06] * 4, [0.3, 0.5, 0.9, 1.2, 2.0] * 4
    assert gaps_pvalue(large, small) < ALPHA
    assert gaps_pvalue(small, large) > 0.5
    assert gaps_pvalue([], large) == 1.0


def parting(gap: float, kind: str = "near tie") -> Parting:
    return Parting(0, 1, 2, gap, kind)


def test_compare_passes_a_tree_like_its_control_and_fails_one_with_more_partings_or_real_differences():
    control = Tally("dflash", 8000, [parting(0.03)] * 20 + [parting(0.4, "float32 tie")] * 6
                    + [parting(0.6, "real difference")] * 2)
    same = Tally("ddtree", 8000, list(control.partings))
    assert compare(same, control).no_worse
    more = Tally("fault", 8000, list(control.partings) * 3)
    verdict = compare(more, control)
    assert not verdict.no_worse and "partings per token" in verdict.reason()
    real = Tally("fault", 8000, [parting(0.03)] * 14 + [parting(0.6, "real difference")] * 14)
    verdict = compare(real, control)
    assert verdict.p_partings >= ALPHA and not verdict.no_worse and "real differences per token" in verdict.reason()


def test_the_tally_summary_reports_rates_per_thousand_tokens():
    t = Tally("ddtree")
    t.add(AnswerWalk(1500, [parting(0.01), parting(0.5, "real difference")]))
    t.add(AnswerWalk(500, [parting(0.04)]))
    assert t.summary() == {"tokens": 2000, "partings": 3, "per 1000": 1.5, "real": 1, "real per 1000": 0.5,
                           "gap median": 0.04, "gap max": 0.5}
