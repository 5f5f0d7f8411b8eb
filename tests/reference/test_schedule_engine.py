"""A DDTree width by running batch size in the reference engine (issue 32): each step's tree takes
the schedule's budget and cap for the requests still running, and decoding stays lossless while
requests finish and the batch crosses the schedule's steps mid-answer."""

from __future__ import annotations

import pytest

from ddtree.reference import Decoder, RequestParams, generate
from ddtree.settings import DDTreeConfigError, parse_schedule

from ..helpers import chi_square_pvalue as chi_square
from .conftest import small_vocab_pair
from .test_engine import PARAMS, PROMPTS, exact_ar_distribution

LIMITS = [6, 14, 22, 40, 64]      # the batch runs 5, 4, 3, 2 then 1 requests


class Recording(Decoder):
    """The decoder, remembering each step's (running requests, budget, cap)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.widths: list[tuple[int, int, int]] = []

    def step_io(self, state):
        io = super().step_io(state)
        self.widths.append((sum(state.active), io.budget, io.topk_cap))
        return io


def decode(decoder: Decoder, prompts, requests):
    state = decoder.start(prompts, requests)
    while not state.done:
        decoder.step(state)
    return state.outputs


def test_greedy_equals_autoregressive_while_the_batch_crosses_the_schedule(pair8):
    budget, cap = parse_schedule("1:32,2:8,4:2", "budget"), parse_schedule("1:8,3:1", "cap")
    decoder = Recording(pair8, "ddtree", budget, cap)
    got = decode(decoder, PROMPTS, [RequestParams(max_new_tokens=n) for n in LIMITS])
    for prompt, n, out in zip(PROMPTS, LIMITS, got):
        [want] = generate(pair8, [prompt], max_new_tokens=n, method="ar")
        assert out.tokens == want.tokens and out.finish_reason == "length"
    # every step took the schedule's width for the requests then running, and all four widths ran
    assert all((b, c) == (budget.at(r), cap.at(r)) for r, b, c in decoder.widths), decoder.widths
    assert {(b, c) for _, b, c in decoder.widths} == {(2, 1), (8, 1), (8, 8), (32, 8)}
    assert decoder.budget == 32 and decoder.window == 32 + 1 + pair8.block_size + 1   # slots for the widest


def test_sampled_continuations_match_autoregressive_on_both_sides_of_a_step():
    """20,000 copies of one prompt, 3 tokens each: they finish at different steps, so the running
    batch falls below 16,000 mid-answer and the width changes from budget 2 cap 1 to 6 cap 3."""
    pair = small_vocab_pair(vocab=6, seed=3, std=0.3)
    prompt, n = [0, 2, 4], 20_000
    want = exact_ar_distribution(pair, prompt, 3, PARAMS)
    decoder = Recording(pair, "ddtree", parse_schedule("1:6,16000:2", "budget"), parse_schedule("1:3,16000:1", "cap"))
    state = decoder.start([prompt] * n, [RequestParams(max_new_tokens=3, **PARAMS)] * n, seed=11)
    while not state.done:
        decoder.step(state)
    assert {(b, c) for _, b, c in decoder.widths} == {(2, 1), (6, 3)}, decoder.widths
    assert chi_square([tuple(o.tokens) for o in state.outputs], want) > 1e-3
    assert sum(sum(o.accept_lengths) for o in state.outputs) > n // 10      # the tree path was exercised


def test_a_schedule_is_checked_at_every_step_and_refused_under_graphs(pair8):
    with pytest.raises(DDTreeConfigError, match="budget"):
        Decoder(pair8, "ddtree", parse_schedule("1:8,4:2000", "budget", maximum=4096), 4)
    with pytest.raises(ValueError, match="schedule by batch size runs eagerly"):
        Decoder(pair8, "ddtree", parse_schedule("1:8,4:4", "budget"), 4, cuda_graphs=True)
    one = Decoder(pair8, "ddtree", 8, 4)                            # one value: the one-step schedule
    assert one.width(1) == one.width(48) == (8, 4)
