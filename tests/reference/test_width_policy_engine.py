"""The width chosen per step by ddtree.width_policy inside the reference engine (issue 70 item 3): whatever the policy
picks - no speculation, the chain, a narrow or a wide tree, changing from step to step - the output is plain
decoding's, greedy token for token in float64 on the dense and the Kimi-shaped pairs, and sampled in distribution."""

from __future__ import annotations

from collections import Counter

import pytest

from ddtree.reference import RequestParams, generate
from ddtree.reference.policy_decoder import PolicyDecoder
from ddtree.width_policy import Calibration, CostCurve, WidthPolicy, options_for

from ..helpers import chi_square_pvalue as chi_square
from .conftest import small_vocab_pair
from .test_engine import PARAMS, PROMPTS, exact_ar_distribution

# a curve on which the policy's value of its options lies close together, so that steps choose differently
MIXED = {"mixed": lambda w: 1 + 0.09 * (w - 1), "steep": lambda w: 1 + 0.5 * (w - 1), "flat": lambda w: 1 + 0.003 * (w - 1)}


def policy(depth: int, curve: str) -> WidthPolicy:
    opts = options_for((2, 4, 8, 16), depth=depth, cap=4)
    table = CostCurve.from_function(lambda b, w: MIXED[curve](w), [1, 2, 4, 8], [o.width for o in opts])
    return WidthPolicy(opts, table, Calibration(depth))


def run(decoder: PolicyDecoder, prompts, requests, seed=None):
    state = decoder.start(prompts, requests, seed=seed)
    while not state.done:
        decoder.step(state)
    return state.outputs


@pytest.mark.parametrize("curve", sorted(MIXED))
def test_greedy_equals_plain_decoding_whatever_width_the_policy_takes(pair8, kimi_pair, curve):
    used = Counter()
    for pair in (pair8, kimi_pair):
        decoder = PolicyDecoder(pair, policy(pair.block_size - 1, curve))
        got = run(decoder, PROMPTS, [RequestParams(max_new_tokens=24)] * len(PROMPTS))
        want = generate(pair, PROMPTS, max_new_tokens=24, method="ar")
        assert [g.tokens for g in got] == [w.tokens for w in want]
        used.update(decoder.chosen)
    if curve == "steep":
        assert used.most_common(1)[0][0] == "none", used
    elif curve == "flat":
        assert used.most_common(1)[0][0] == "b16", used
    else:
        assert len(used) >= 3, used                     # the widths changed from step to step


def test_sampled_continuations_match_plain_decoding_while_the_width_changes():
    pair = small_vocab_pair(vocab=6, seed=3, std=0.3)
    prompt, n = [0, 2, 4], 6000
    want = exact_ar_distribution(pair, prompt, 3, PARAMS)
    decoder = PolicyDecoder(pair, policy(pair.block_size - 1, "mixed"))
    outputs = run(decoder, [prompt] * n, [RequestParams(max_new_tokens=3, **PARAMS)] * n, seed=5)
    assert chi_square([tuple(o.tokens) for o in outputs], want) > 1e-3
    assert len(set(decoder.chosen)) >= 2, decoder.chosen


def test_a_deliberately_wrong_verify_is_caught_by_the_greedy_comparison(pair8):
    """The control: the same decoder with the engine's test-only corruption of an emitted token every 3rd step."""
    decoder = PolicyDecoder(pair8, policy(pair8.block_size - 1, "mixed"))
    decoder.corrupt_every = 3
    got = run(decoder, PROMPTS, [RequestParams(max_new_tokens=24)] * len(PROMPTS))
    want = generate(pair8, PROMPTS, max_new_tokens=24, method="ar")
    assert [g.tokens for g in got] != [w.tokens for w in want]
