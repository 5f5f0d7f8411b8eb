"""ddtree.reference.enlarge (issue 69): a Kimi-shaped pair widened to more hidden dimensions, heads, q_lora, dense
width, experts and vocabulary, with extra MoE layers, computes what the small pair computes - in float64 on the CPU,
logit for logit, greedy token for token, and DDTREE on it gives the small pair's plain decoding - while its extra
layers' routers read many experts (the INT4 form: tests/sglang/test_enlarge_int4.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ddtree.reference import generate
from ddtree.reference.draft import DFlashDraft
from ddtree.reference.enlarge import (NEVER_BIAS, Enlargement, FloatExperts, enlarged_draft_config,
                                      enlarged_draft_tensors, enlarged_target_config, enlarged_target_tensors,
                                      extra_layer_tensors)
from ddtree.reference.pair import Pair, init_pair
from ddtree.reference.target import TargetLM

from .conftest import kimi_shaped_configs

BIG = Enlargement(hidden=256, heads=8, q_lora=96, dense_inter=160, experts=20, vocab=300, extra_layers=2)
PROMPTS = [[256, 10, 20, 30, 40], [256, 7, 101], [256, 99, 98, 97, 96, 95, 94, 93, 92]]


def small_pair() -> Pair:
    """A Kimi-shaped pair whose routers take every expert (top 8 of 8), as the decidable kimi-allexp pair."""
    target_cfg, draft_cfg = kimi_shaped_configs()
    target_cfg.num_experts_per_tok = 8
    return init_pair(target_cfg, draft_cfg, seed=5, std=0.08)


def enlarge(pair: Pair, big: Enlargement = BIG) -> Pair:
    target = TargetLM(enlarged_target_config(pair.target.config, big))
    target.load_state_dict(enlarged_target_tensors(pair, big))
    draft = DFlashDraft(enlarged_draft_config(pair.draft.config, pair.target.config, big), big.hidden,
                        target.embed_tokens, target.lm_head)
    draft.load_state_dict(enlarged_draft_tensors(pair, big))
    return Pair(target=target.double().eval(), draft=draft.double().eval(), tokenizer=pair.tokenizer)


@pytest.fixture(scope="module")
def pairs():
    small = small_pair()
    big = enlarge(small)
    small.target.double().eval()
    small.draft.double().eval()
    return small, big


def test_the_enlarged_target_gives_the_small_targets_logits_and_its_added_tokens_never_win(pairs):
    small, big = pairs
    tokens = torch.tensor([[256, 5, 9, 14, 3, 77, 41, 200, 120, 33]])
    with torch.no_grad():
        a = small.target.forward_sequence(tokens, capture=(0, 1, 2))
        b = big.target.forward_sequence(tokens, capture=(0, 1, 2))
    v, h = small.target.config.vocab_size, small.target.config.hidden_size
    # the eps the q_lora and KV-latent norms share moves them by less than eps / mean square: far below bf16's 4e-3
    torch.testing.assert_close(b.logits[..., :v], a.logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(b.logits.argmax(-1), a.logits.argmax(-1))
    assert torch.equal(b.logits[..., v:], b.logits[..., BIG.filler_token:BIG.filler_token + 1].expand(-1, -1, 300 - v))
    # what the draft reads: each captured layer's small-pair dimensions, the added ones exactly zero
    captured = b.hidden.view(1, 10, 3, BIG.hidden)
    torch.testing.assert_close(captured[..., :h].reshape(1, 10, -1), a.hidden, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(captured[..., h:]) == 0


def test_ddtree_on_the_enlarged_pair_gives_the_small_pairs_plain_decoding(pairs):
    small, big = pairs
    plain = [g.tokens for g in generate(small, PROMPTS, max_new_tokens=20, method="ar")]
    assert [g.tokens for g in generate(big, PROMPTS, max_new_tokens=20, method="ar")] == plain
    for budget, cap in ((3, 1), (8, 4)):
        tree = generate(big, PROMPTS, max_new_tokens=20, method="ddtree", budget=budget, topk_cap=cap)
        assert [g.tokens for g in tree] == plain
    # the widened draft proposes what the small draft proposes: the same accepted lengths step by step
    small_tree = generate(small, PROMPTS, max_new_tokens=20, method="ddtree", budget=8, topk_cap=4)
    big_tree = generate(big, PROMPTS, max_new_tokens=20, method="ddtree", budget=8, topk_cap=4)
    assert [g.num_verify_steps for g in big_tree] == [g.num_verify_steps for g in small_tree]


def test_the_small_layers_never_pick_an_added_expert_and_an_extra_layer_reads_many(pairs):
    small, big = pairs
    tokens = torch.tensor([[256, *range(30, 90)]])
    picked = {}
    hooks = []
    for i, layer in enumerate(big.target.layers):
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda mod, args, out, i=i: picked.setdefault(i, set()).update(out[1].flatten().tolist())))
    with torch.no_grad():
        big.target.forward_sequence(tokens)
    for h in hooks:
        h.remove()
    n_small = small.target.config.num_hidden_layers
    for i, ids in picked.items():
        if i < n_small:
            assert ids == set(range(8)), (i, ids)                     # the small pair's 8 experts, every token
        else:
            assert len(ids) > 12, (i, ids)                            # real routing over all 20 experts
    assert sorted(picked) == list(range(1, n_small + BIG.extra_layers))
    bias = enlarged_target_tensors(small, BIG)["layers.1.mlp.gate.e_score_correction_bias"]
    assert torch.all(bias[8:] == NEVER_BIAS)


def test_an_enlargement_that_would_narrow_or_cannot_keep_the_function_is_refused_by_name():
    pair = small_pair()
    with pytest.raises(ValueError, match="hidden 32 is below the small pair's 64"):
        enlarged_target_tensors(pair, replace(BIG, hidden=32))
    with pytest.raises(ValueError, match="experts 4 is below the small pair's 8"):
        enlarged_target_tensors(pair, replace(BIG, experts=4))
    grouped = small_pair()
    grouped.target.config.n_group = 2
    with pytest.raises(ValueError, match="n_group 2 / topk_group 1: added experts would change the groups"):
        enlarged_target_tensors(grouped, BIG)


def test_extra_layers_are_made_one_at_a_time_each_from_its_own_seed():
    cfg = small_pair().target.config
    one = extra_layer_tensors(5, cfg, BIG, FloatExperts())
    again = extra_layer_tensors(5, cfg, BIG, FloatExperts())
    assert all(torch.equal(one[k], again[k]) for k in one)            # the same however many are made
    assert torch.count_nonzero(one["layers.5.self_attn.o_proj.weight"]) == 0
    assert torch.count_nonzero(one["layers.5.mlp.experts.7.down_proj.weight"]) == 0


def test_a_widening_that_forgets_the_norms_rescale_is_caught_by_the_logit_check(monkeypatch):
    """The deliberate fault: RMSNorm weights left as they are over the wider stream. The check above must fail it."""
    import ddtree.reference.enlarge as enlarge_module

    small = small_pair()
    monkeypatch.setattr(enlarge_module, "norm_scale", lambda small_width, big_width: 1.0)
    wrong = enlarge(small)
    small.target.double().eval()
    tokens = torch.tensor([[256, 5, 9, 14, 3, 77, 41, 200, 120, 33]])
    with torch.no_grad():
        a = small.target.forward_sequence(tokens).logits
        b = wrong.target.forward_sequence(tokens).logits[..., :a.shape[-1]]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_the_graph_timing_draws_only_the_tokens_the_enlarged_pair_embeds(pairs):
    """Issue 70's start-up table timed random ids; on the enlarged pair every added token's embedding row is zero, so
    two added tokens run the very same forward (the same experts in every layer) and a replay of them times one
    token's expert read. The timing's ids (graph_timing.embedded_ids) are the small pair's tokens alone."""
    from ddtree.sglang.policy.graph_timing import embedded_ids

    small, big = pairs
    v = small.target.config.vocab_size
    assert torch.equal(embedded_ids(big.target.embed_tokens.weight, 0, BIG.vocab), torch.arange(v))
    with torch.no_grad():
        added = [big.target.forward_sequence(torch.tensor([[t]])).logits for t in (v + 3, BIG.vocab - 1)]
        live = [big.target.forward_sequence(torch.tensor([[t]])).logits for t in (5, 77)]
    assert torch.equal(added[0], added[1])
    assert not torch.equal(live[0], live[1])
