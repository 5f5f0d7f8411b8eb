"""The reference engine: dflash and ddtree are lossless against plain autoregressive decoding."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter

import pytest
import torch

from ddtree.reference import Decoder, RequestParams, generate, load_pair
from ddtree.reference.target import KVCache
from ddtree.verify import target_probs

from ..helpers import chi_square_pvalue as chi_square
from .conftest import small_vocab_pair

PROMPTS = [[0, 2, 3], [0], [0, 5, 6, 2, 3, 4, 1, 2], [0, 3, 3, 3, 3], [0, 6]]


@pytest.fixture(scope="module")
def ar_out(pair8):
    return generate(pair8, PROMPTS, max_new_tokens=64, method="ar")


@pytest.mark.parametrize("budget,cap", list(itertools.product([1, 4, 32], [1, 2, 8])))
def test_ddtree_greedy_equals_autoregressive(pair8, ar_out, budget, cap):
    out = generate(pair8, PROMPTS, max_new_tokens=64, method="ddtree", budget=budget, topk_cap=cap)
    for a, b in zip(ar_out, out):
        assert b.tokens == a.tokens
        assert len(b.accept_lengths) == b.num_verify_steps
        assert sum(x + 1 for x in b.accept_lengths) >= len(b.tokens)


def test_dflash_greedy_equals_autoregressive_and_accepts_something(pair8, ar_out):
    out = generate(pair8, PROMPTS, max_new_tokens=64, method="dflash")
    assert [o.tokens for o in out] == [a.tokens for a in ar_out]
    assert sum(sum(o.accept_lengths) for o in out) > 0, "no draft token was ever accepted: the test is vacuous"
    assert all(o.num_verify_steps < 64 for o in out if sum(o.accept_lengths) > 0)


def test_trees_accept_more_than_the_chain(pair8):
    chain = generate(pair8, PROMPTS, max_new_tokens=64, method="dflash")
    tree = generate(pair8, PROMPTS, max_new_tokens=64, method="ddtree", budget=32, topk_cap=8)
    assert sum(o.num_verify_steps for o in tree) < sum(o.num_verify_steps for o in chain)


def test_stop_tokens_hit_at_different_steps(pair8, ar_out):
    stop = Counter(t for a in ar_out for t in a.tokens[5:]).most_common(1)[0][0]
    want = generate(pair8, PROMPTS, max_new_tokens=64, method="ar", stop_token_ids=[stop])
    got = generate(pair8, PROMPTS, max_new_tokens=64, method="ddtree", budget=8, topk_cap=2, stop_token_ids=[stop])
    assert [g.tokens for g in got] == [w.tokens for w in want]
    stopped = [len(w.tokens) for w in want if w.finish_reason == "stop"]
    assert len(set(stopped)) >= 2, "requests should stop at different steps"
    for w in want:
        assert (w.tokens[-1] == stop) == (w.finish_reason == "stop")
        assert stop not in w.tokens[:-1]


def exact_ar_distribution(pair, prompt: list[int], length: int, params: dict) -> dict[tuple, float]:
    """P(next `length` tokens) by running the target on every prefix (no speculation)."""
    out: dict[tuple, float] = {}

    def probs(ctx: list[int]) -> torch.Tensor:
        t = len(ctx)
        cache = KVCache.empty(2, 1, 2, t, 16, "cpu", torch.float64)
        pos = torch.arange(t)[None]
        mask = pos[:, :, None] >= torch.arange(t)[None, None, :]
        logits = pair.target(torch.tensor([ctx]), pos, cache, pos, mask).logits[:, -1]
        one = lambda v, dt: torch.tensor([v], dtype=dt)  # noqa: E731
        p = target_probs(logits, one(params["temperature"], torch.float32), one(params["top_k"], torch.int64),
                         one(params["top_p"], torch.float32), one(params["min_p"], torch.float32))[0].double()
        return p / p.sum()

    def rec(ctx, prefix, prob):
        if len(prefix) == length:
            out[prefix] = prob
            return
        for t, pt in enumerate(probs(ctx).tolist()):
            if pt > 0:
                rec(ctx + [t], prefix + (t,), prob * pt)

    with torch.no_grad():
        rec(list(prompt), (), 1.0)
    return out


PARAMS = dict(temperature=0.9, top_k=4, top_p=0.95, min_p=0.02)


def test_sampled_continuations_match_autoregressive():
    pair = small_vocab_pair(vocab=6, seed=3, std=0.3)
    prompt = [0, 2, 4]
    want = exact_ar_distribution(pair, prompt, 3, PARAMS)
    n = 20_000
    out = generate(pair, [prompt] * n, max_new_tokens=3, method="ddtree", budget=6, topk_cap=3, seed=7, **PARAMS)
    assert chi_square([tuple(o.tokens) for o in out], want) > 1e-3
    ar = generate(pair, [prompt] * n, max_new_tokens=3, method="ar", seed=7, **PARAMS)
    assert chi_square([tuple(o.tokens) for o in ar], want) > 1e-3
    # the walk must have accepted draft tokens for this to test the tree path
    assert sum(sum(o.accept_lengths) for o in out) > n // 10


def test_bad_arguments_raise_clear_errors(pair8):
    with pytest.raises(ValueError, match="method='beam'"):
        Decoder(pair8, "beam")
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        generate(pair8, [[]], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"prompts\[0\] \+ max_new_tokens=1025"):
        generate(pair8, [[0]], max_new_tokens=1024)
    with pytest.raises(ValueError, match=r"temperature\[0\]=-1"):
        Decoder(pair8, "ar").start([[0]], [RequestParams(max_new_tokens=2, temperature=-1)])
    with pytest.raises(ValueError, match=r"prompts\[0\]=\[0, 99\]"):
        generate(pair8, [[0, 99]], max_new_tokens=2)


def test_init_cli_is_deterministic_and_loadable(tmp_path):
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "ddtree.reference.init", "--out", str(tmp_path / name),
                        "--seed", "0", "--preset", "tiny"], check=True, capture_output=True)
    for part in ("target", "draft"):
        for f in ("config.json", "model.safetensors"):
            assert (tmp_path / "a" / part / f).read_bytes() == (tmp_path / "b" / part / f).read_bytes()
    pair = load_pair(tmp_path / "a")
    assert pair.block_size == 4 and pair.tokenizer.vocab_size == 260
    text = "def f(x):"
    out = generate(pair, [pair.tokenizer.encode(text)], max_new_tokens=5, method="ddtree", budget=8, topk_cap=4)
    assert len(out[0].tokens) == 5


def test_load_pair_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pair(tmp_path / "nowhere")


def test_logprobs_are_the_targets_and_the_test_corruption_changes_the_output(pair8, ar_out):
    dec = Decoder(pair8, "ddtree", 8, 2)
    state = dec.start([PROMPTS[0]], [RequestParams(max_new_tokens=64, logprobs_top=3)])
    while not state.done:
        dec.step(state)
    gen = state.outputs[0]
    assert gen.tokens == ar_out[0].tokens and len(gen.logprobs) == 64
    for tok, (lp, top) in zip(gen.tokens, gen.logprobs):
        assert top[0][0] == tok and lp == pytest.approx(top[0][1]) and top[0][1] >= top[1][1] >= top[2][1]
    broken = Decoder(pair8, "ddtree", 8, 2, corrupt_every=3)
    state = broken.start([PROMPTS[0]], [RequestParams(max_new_tokens=64)])
    while not state.done:
        broken.step(state)
    assert state.outputs[0].tokens != ar_out[0].tokens
    assert Decoder(pair8, "ar", corrupt_every=3).corrupt_every == 0  # never the baseline


def test_block_logits_equal_the_decoders_draft_pass_per_anchor(pair8):
    """The training / offline form of the draft (K blocks in one pass) equals forward() per block."""
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 7, (2, 20), generator=g)
    layers = tuple(pair8.draft.config.target_layer_ids)
    hidden = pair8.target.forward_sequence(tokens, capture=layers).hidden
    anchors = torch.tensor([[3, 7, 12], [0, 5, 19]])
    got = pair8.draft.block_logits(hidden, tokens, anchors)                       # [2, 3, L, V]
    for b in range(2):
        for k, a in enumerate(anchors[b].tolist()):
            ctx = pair8.draft.new_context(1, 24)
            if a:
                pos = torch.arange(a)[None]
                pair8.draft.extend_context(ctx, hidden[b:b + 1, :a], pos, pos)
            want = pair8.draft(tokens[b, a:a + 1], torch.tensor([a]), ctx, torch.tensor([a]))
            torch.testing.assert_close(got[b, k], want[0], rtol=1e-9, atol=1e-9)


def test_forward_sequence_equals_the_cached_prefill(pair8):
    tokens = torch.tensor([[0, 3, 2, 5, 1, 4]])
    full = pair8.target.forward_sequence(tokens).logits
    cache = pair8.target.new_cache(1, 8)
    pos = torch.arange(6)[None]
    mask = pos[:, :, None] >= torch.arange(8)[None, None, :]
    torch.testing.assert_close(full, pair8.target(tokens, pos, cache, pos, mask).logits)


@pytest.mark.parametrize("method,budget,cap", [("dflash", 3, 1), ("ddtree", 4, 2), ("ddtree", 16, 4)])
def test_offline_accept_count_equals_the_decoders(pair8, method, budget, cap):
    from ddtree.reference.offline import offline_accept_lengths

    n, total = 40, 0
    for prompt in PROMPTS[:3]:
        cont = generate(pair8, [prompt], max_new_tokens=n + pair8.block_size, method="ar")[0].tokens
        engine = generate(pair8, [prompt], max_new_tokens=n, method=method, budget=budget, topk_cap=cap)[0]
        if method == "dflash":
            budget, cap = pair8.block_size - 1, 1
        offline = offline_accept_lengths(pair8, prompt, cont, budget=budget, topk_cap=cap, max_new_tokens=n)
        assert offline == engine.accept_lengths
        first = offline_accept_lengths(pair8, prompt, cont, budget=budget, topk_cap=cap, max_steps=3)
        assert first == engine.accept_lengths[:3]
        total += sum(offline)
    assert total > 0, "nothing accepted: the comparison is vacuous"


def test_cancel_ends_a_batch_and_keeps_what_it_emitted(pair8):
    decoder = Decoder(pair8, "ddtree", 4, 2)
    state = decoder.start(PROMPTS[:2], [RequestParams(max_new_tokens=50)] * 2)
    decoder.step(state)
    emitted = [list(o.tokens) for o in state.outputs]
    decoder.cancel(state)
    assert state.done and not state.live.any()
    assert [o.finish_reason for o in state.outputs] == ["cancelled", "cancelled"]
    assert [o.tokens for o in state.outputs] == emitted and all(emitted)


def test_a_request_ended_from_outside_stops_advancing(pair8):
    """A server cancels a request by clearing state.active[b]; its row must stop moving (its cache
    slots are sized for its own max_new_tokens), while the others decode on unchanged."""
    decoder = Decoder(pair8, "ddtree", 4, 2)
    req = RequestParams(max_new_tokens=30)
    alone = decoder.start(PROMPTS[:1], [req])
    while not alone.done:
        decoder.step(alone)
    state = decoder.start(PROMPTS[:2], [req, RequestParams(max_new_tokens=3)])
    decoder.step(state)
    state.active[1] = False                                   # cancelled by the caller
    frozen = int(state.lengths[1])
    while not state.done:
        decoder.step(state)
    assert int(state.lengths[1]) == frozen
    assert state.outputs[0].tokens == alone.outputs[0].tokens
