"""The GPU tests' two rules for speculative answers (testbed/partings.py) on the CPU: the top-2-of-8
statistical rule (the walk of an answer to its end against a small deterministic plain decoder, and the three
one-sided tests against hand-computed values) and the temperature-0 rule of the pairs where identity is decidable
(strict_walk, which test_ddtree_server.near_ties_against_plain runs on a NONE server: every GPU test's greedy
verdict)."""

from __future__ import annotations

import math

import pytest
import torch

from testbed.partings import (ALPHA, STRICT_LIMIT, AnswerWalk, PlainModel, Tally, compare, gaps_pvalue,
                                       rate_pvalue, strict_walk, walk_answer)
from testbed.referee import Parting

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


# --- the temperature-0 rule ----------------------------------------------------------------------------------------

def with_ties(answer_len: int, ties: int, real_at: int | None = None, start: int = 2) -> list[int]:
    """Plain decoding's answer, but taking plain decoding's near-tie second token at the first `ties` positions from
    `start` where the context's sum is even (one position apart at least), and at `real_at` a token 3.8 below."""
    have: list[int] = []
    taken = 0
    while len(have) < answer_len:
        top = plain_top(PROMPT + have)
        best = max(top, key=top.get)
        pos = len(have)
        if pos == real_at:
            have.append((best + 2) % VOCAB)
        elif taken < ties and pos >= start and sum(PROMPT + have) % 2 == 0 and (not have or pos > start):
            have.append((best + 1) % VOCAB)
            taken += 1
            start = pos + 2
        else:
            have.append(best)
    return have


def counting_plain(referee=None) -> tuple[PlainModel, list]:
    calls: list = []

    def cont(context, n):
        calls.append(len(context))
        return continue_greedy(context, n)
    return PlainModel(plain_top, cont, referee), calls


def test_strict_walk_passes_an_identical_answer_and_near_ties_up_to_its_limit():
    want = continue_greedy(PROMPT, 40)
    assert strict_walk(PLAIN, PROMPT, want, list(want)) == ([], None)
    have = with_ties(40, STRICT_LIMIT)
    records, failure = strict_walk(PLAIN, PROMPT, want, have)
    assert failure is None and records == [pytest.approx(0.03)] * STRICT_LIMIT


def test_strict_walk_fails_past_its_limit_of_near_ties_and_at_the_first_real_difference():
    want = continue_greedy(PROMPT, 60)
    records, failure = strict_walk(PLAIN, PROMPT, want, with_ties(60, STRICT_LIMIT + 1))
    assert failure == f"more than {STRICT_LIMIT} near ties" and len(records) == STRICT_LIMIT + 1
    have = with_ties(60, 1, real_at=30)
    plain, calls = counting_plain()
    records, failure = strict_walk(plain, PROMPT, want, have)
    assert records[0] == pytest.approx(0.03) and records[1] == pytest.approx(3.8)
    assert failure.startswith("position 30: token ") and "lies 3.8000 below it" in failure
    assert len(calls) == 1              # re-anchored after the near tie only: nothing asked past the real difference


def test_strict_walk_takes_the_float32_referees_verdict_past_a_bf16_near_tie():
    want = continue_greedy(PROMPT, 20)
    have = with_ties(20, 0, real_at=7)
    cleared = PlainModel(plain_top, continue_greedy, float32_says({len(PROMPT) + 7: have[7]}))
    records, failure = strict_walk(cleared, PROMPT, want, have)
    assert failure is None and records[0][0] == "exact" and records[0][1] == pytest.approx(3.8)
    records, failure = strict_walk(PlainModel(plain_top, continue_greedy, float32_says({})), PROMPT, want, have)
    assert "the float32 model picks 0" in failure


def test_strict_walk_judges_a_plain_answer_that_ends_early_instead_of_failing_on_it():
    have = continue_greedy(PROMPT, 30)
    assert strict_walk(PLAIN, PROMPT, have[:20], have) == ([0.0], None)      # was an IndexError before 2026-12-05


class NoneServer:
    """Stands in for a NONE server (testbed.servers.Server: next_top, generate) with the fixed decoder, so that
    near_ties_against_plain's use of a server is checked as the GPU tests make it."""

    def next_top(self, context, k=5):
        return plain_top(context)

    def generate(self, context, sampling, **extra):
        return {"output_ids": continue_greedy(context, sampling["max_new_tokens"])}


def test_near_ties_against_plain_on_a_server_gives_the_strict_walks_verdicts():
    from tests.gpu_sglang.test_ddtree_server import near_ties_against_plain
    from testbed.referee import Referee

    want = continue_greedy(PROMPT, 60)
    for have in (list(want), with_ties(60, 3), with_ties(60, STRICT_LIMIT + 1), with_ties(60, 1, real_at=30)):
        assert near_ties_against_plain(NoneServer(), PROMPT, want, have) == strict_walk(PLAIN, PROMPT, want, have)
    have = with_ties(60, 0, real_at=7)
    exact = Referee(float32_says({len(PROMPT) + 7: have[7]}))
    records, failure = near_ties_against_plain(NoneServer(), PROMPT, want, have, exact=exact)
    assert failure is None and records[0][0] == "exact"
