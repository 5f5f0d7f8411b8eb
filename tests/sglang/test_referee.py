"""The GPU tests' float32 referee of a temperature-0 parting (testbed/referee.py), on the CPU: the
verdict on crafted log-probs, and the referee built from a real saved Kimi-shaped pair as the GPU tests build
it (bf16-rounded weights; the INT4 checkpoint's served experts) picking the reference engine's greedy token.
Runs in the SGLang contract venv (compressed-tensors is there)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="run in the SGLang contract venv (make test)")

from ddtree.reference import generate  # noqa: E402
from ddtree.reference.config import DraftConfig  # noqa: E402
from ddtree.reference.export import int4_roundtrip  # noqa: E402
from ddtree.reference.pair import init_pair, load_pair, save_pair  # noqa: E402
from testbed.referee import (NEAR_TIE, best_gap, bf16_served_pair, gap_to, int4_served_target,  # noqa: E402
                                      is_near_tie, judge, target_referee)

from .test_reference_mla import kimi_shaped  # noqa: E402


def logprobs(values: dict[int, float], vocab: int = 8) -> torch.Tensor:
    """Log-probs [vocab] with the given tokens' values; every other token far below."""
    out = torch.full((vocab,), -30.0)
    for token, value in values.items():
        out[token] = value
    return out


NEAR = {3: -0.5, 5: -0.53125}                    # plain decoding's top: its token 3, token 5 a near tie below
FAR = {3: -0.1, 5: -0.69}                        # token 5 0.59 below: no near tie


@pytest.mark.parametrize("plain_top,f32,kind", [
    (NEAR, None, "near tie"),                                              # plain decoding's own near tie
    ({3: -0.5, 5: -0.5}, None, "near tie"),
    ({3: -0.5, 4: -0.5, 5: -0.5}, None, "near tie"),                       # an exact three-way tie
    ({3: -0.5, 4: -0.52, 5: -0.5 - NEAR_TIE - 0.01}, None, "real difference"),  # third, past the bound
    (NEAR, {3: -0.1, 5: -0.3}, "near tie"),                                # a bf16 near tie: no referee asked
    ({3: -0.5, 6: -0.51}, None, "real difference"),                        # a near tie, but not the token taken
    (FAR, None, "real difference"),                                        # no referee: the strict rule
    (FAR, {5: -0.1, 3: -0.3}, "exact"),                                    # the float32 model takes it
    (FAR, {3: -0.10, 5: -0.14}, "float32 tie"),                            # float32 within a near tie
    (FAR, {3: -0.1, 5: -0.1 - NEAR_TIE}, "float32 tie"),                   # at the bound
    (FAR, {3: -0.1, 5: -0.2}, "real difference"),                          # float32 prefers plain's by 0.1
    (FAR, {3: -0.10, 4: -0.11, 5: -0.12}, "float32 tie"),                  # third, inside a three-way near tie
    (FAR, {3: -0.10, 4: -0.11, 5: -0.2}, "real difference"),               # third, past the bound
])
def test_a_parting_is_judged_by_the_near_tie_rule_then_the_float32_model(plain_top, f32, kind):
    asked = []
    parting = judge(17, 3, 5, plain_top, None if f32 is None else lambda: asked.append(1) or logprobs(f32))
    assert len(asked) == (f32 is not None and kind != "near tie")          # the referee runs past a near tie only
    assert parting.kind == kind
    assert parting.passed == (kind != "real difference")
    assert math.isclose(parting.bf16_gap, max(plain_top.values()) - plain_top.get(5, min(plain_top.values())))
    if f32 is not None and kind != "near tie":
        assert parting.float32_best == max(f32, key=f32.get)
        assert math.isclose(parting.float32_gap, f32.get(3, -30.0) - f32.get(5, -30.0), abs_tol=1e-6)
    if not parting.passed:
        assert "position 17: token 5" in parting.reason() and f"lies {parting.bf16_gap:.4f} below" in parting.reason()
    if kind in ("exact", "float32 tie"):
        assert parting.record()[0] == kind


def test_gaps_read_from_a_top_k():
    top = {1: -0.2, 2: -0.7, 9: -1.5}
    assert math.isclose(best_gap(top), 0.5) and math.isclose(gap_to(top, 2), 0.5)
    assert math.isclose(gap_to(top, 4), 1.3)                               # outside the top k: at least its last
    assert is_near_tie({1: -0.2, 2: -0.2 - NEAR_TIE}, 2) and not is_near_tie({1: -0.2, 2: -0.3}, 7)


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    cfg = kimi_shaped(vocab_size=260, bos_token_id=256, eos_token_id=257, moe_intermediate_size=64)
    draft = DraftConfig(hidden_size=cfg.hidden_size, block_size=4, target_layer_ids=[0, 1], mask_token_id=258)
    pair = init_pair(cfg, draft, seed=5, std=0.05)
    out = tmp_path_factory.mktemp("ref")
    save_pair(pair, out)
    return out


PROMPTS = [[256, 10, 20, 30, 40], [256, 7], [256, 99, 98, 97, 96, 95, 94]]


def test_the_bf16_referee_picks_the_engines_greedy_tokens(saved_pair):
    pair = bf16_served_pair(saved_pair, "cpu")
    assert all(torch.equal(p, p.to(torch.bfloat16).float()) for p in pair.target.parameters())
    referee = target_referee(pair.target, "cpu")
    for prompt, answer in zip(PROMPTS, generate(pair, PROMPTS, max_new_tokens=6, method="ar")):
        for i, token in enumerate(answer.tokens):
            assert referee.choice(prompt + answer.tokens[:i]) == token
        lp = referee.logprobs(prompt)
        assert lp.shape == (260,) and math.isclose(float(lp.exp().sum()), 1.0, rel_tol=1e-5)


def test_the_int4_referee_serves_the_int4_experts_and_bf16_elsewhere(saved_pair):
    trained = load_pair(saved_pair, device="cpu", dtype=torch.float32).target
    plain = bf16_served_pair(saved_pair, "cpu").target
    served = int4_served_target(saved_pair, "cpu")
    names = ("gate_proj", "up_proj", "down_proj")
    experts = [(getattr(e, n).weight, getattr(t, n).weight)
               for layer, trained_layer in zip(served.layers, trained.layers)
               for e, t in zip(getattr(layer.mlp, "experts", []), getattr(trained_layer.mlp, "experts", [])) for n in names]
    assert experts, "the Kimi-shaped target has routed experts"
    assert all(torch.equal(w, int4_roundtrip(t)) for w, t in experts)            # what the INT4 export serves
    assert not all(torch.equal(w, t.to(torch.bfloat16).float()) for w, t in experts)
    expert_ids = {id(w) for w, _ in experts}
    rest = [(p, q) for p, q in zip(served.parameters(), plain.parameters()) if id(p) not in expert_ids]
    assert rest and all(torch.equal(p, q) for p, q in rest)                      # every other weight bf16-rounded
    referee = target_referee(served, "cpu")
    with torch.no_grad():
        want = int(served.forward_sequence(torch.tensor([PROMPTS[0]])).logits[0, -1].argmax())
    assert referee.choice(PROMPTS[0]) == want
