"""The reference engine's DeepSeek-V3 target (ddtree.reference.mla: MLA with DeepSeek's YaRN, the
noaux_tc mixture of experts) against Hugging Face's DeepseekV3ForCausalLM from the pinned stack
(transformers 5.19, as sglang 0.5.23 pins it), in float64 with the same weights: the same logits.
Runs in the SGLang contract venv (the test venv has no transformers)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="run in the SGLang contract venv (make test)")

from ddtree.reference.config import TargetConfig  # noqa: E402
from ddtree.reference.target import TargetLM  # noqa: E402

YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 64, "beta_fast": 1.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0}


def kimi_shaped(**change) -> TargetConfig:
    """Kimi K2.6's text model at test size: MLA, 1 dense layer then MoE (8 experts, top 2 of one group,
    a shared expert), YaRN factor 64."""
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=4, head_dim=48, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_theta=50000.0, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                v_head_dim=24, rope_scaling=dict(YARN), n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                moe_intermediate_size=40, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
                routed_scaling_factor=2.5)
    base.update(change)
    return TargetConfig(**base)


def hf_model(cfg: TargetConfig):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    s = cfg.rope_scaling
    rope = ({"rope_type": "yarn", "rope_theta": cfg.rope_theta, "factor": s["factor"],
             "original_max_position_embeddings": s["original_max_position_embeddings"], "beta_fast": s["beta_fast"],
             "beta_slow": s["beta_slow"], "mscale": s["mscale"], "mscale_all_dim": s["mscale_all_dim"]}
            if s else {"rope_type": "default", "rope_theta": cfg.rope_theta})
    hf_cfg = DeepseekV3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=cfg.moe_intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_attention_heads,
        n_shared_experts=cfg.n_shared_experts, n_routed_experts=cfg.n_routed_experts,
        routed_scaling_factor=cfg.routed_scaling_factor, kv_lora_rank=cfg.kv_lora_rank, q_lora_rank=cfg.q_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim, qk_nope_head_dim=cfg.qk_nope_head_dim,
        n_group=cfg.n_group, topk_group=cfg.topk_group, num_experts_per_tok=cfg.num_experts_per_tok,
        first_k_dense_replace=cfg.first_k_dense_replace, norm_topk_prob=cfg.norm_topk_prob,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps, rope_parameters=rope,
        rope_interleave=True, tie_word_embeddings=False, attention_bias=False)
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"      # the per-expert loop (grouped_mm takes no float64)
    return DeepseekV3ForCausalLM(hf_cfg).double().eval()


def copy_into_hf(ref: TargetLM, hf) -> None:
    """The reference's weights under DeepseekV3's names (its routed experts as one fused tensor)."""
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(ref.embed_tokens.weight)
        hf.model.norm.weight.copy_(ref.norm.weight)
        hf.lm_head.weight.copy_(ref.lm_head.weight)
        for mine, theirs in zip(ref.layers, hf.model.layers):
            theirs.input_layernorm.weight.copy_(mine.input_layernorm.weight)
            theirs.post_attention_layernorm.weight.copy_(mine.post_attention_layernorm.weight)
            for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
                         "o_proj"):
                getattr(theirs.self_attn, name).weight.copy_(getattr(mine.self_attn, name).weight)
            if hasattr(mine.mlp, "experts"):
                theirs.mlp.gate.weight.copy_(mine.mlp.gate.weight)
                theirs.mlp.gate.e_score_correction_bias.copy_(mine.mlp.gate.e_score_correction_bias)
                for e, expert in enumerate(mine.mlp.experts):
                    theirs.mlp.experts.gate_up_proj[e].copy_(torch.cat([expert.gate_proj.weight, expert.up_proj.weight]))
                    theirs.mlp.experts.down_proj[e].copy_(expert.down_proj.weight)
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(theirs.mlp.shared_experts, name).weight.copy_(getattr(mine.mlp.shared_experts, name).weight)
            else:
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(theirs.mlp, name).weight.copy_(getattr(mine.mlp, name).weight)


def randomized(cfg: TargetConfig, seed: int = 0) -> TargetLM:
    torch.manual_seed(seed)
    model = TargetLM(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
        for layer in model.layers:
            if hasattr(layer.mlp, "gate"):       # a correction bias that changes some choices
                layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(cfg.n_routed_experts, dtype=torch.float64) * 0.05)
    return model


@pytest.mark.parametrize("change", [{}, {"rope_scaling": None}, {"n_group": 2, "topk_group": 1, "n_routed_experts": 8}],
                         ids=["yarn", "plain-rope", "two-groups"])
def test_the_reference_deepseek_v3_target_gives_hugging_faces_logits(change):
    cfg = kimi_shaped(**change)
    ref = randomized(cfg)
    hf = hf_model(cfg)
    copy_into_hf(ref, hf)
    tokens = torch.randint(0, cfg.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mine = ref.forward_sequence(tokens).logits
        theirs = hf(input_ids=tokens).logits
    # Hugging Face computes the rope angles in float32 (the reference in float64): ~1e-8 apart
    assert (mine - theirs).abs().max().item() < 1e-6
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))


def test_cached_decoding_and_a_tree_pass_give_the_sequence_pass_logits():
    """The engine's form: a prefill, then tokens written one at a time into the cache, equal the causal
    pass over the whole sequence (MLA's keys and values kept per head in the reference cache)."""
    cfg = kimi_shaped()
    ref = randomized(cfg, seed=3)
    tokens = torch.randint(0, cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = ref.forward_sequence(tokens).logits
        cache = ref.new_cache(1, 40)
        pos = torch.arange(40)[None]
        prefill = ref(tokens[:, :30], pos[:, :30], cache, pos[:, :30], pos[:, :30, None] >= pos[:, None, :])
        steps = [ref(tokens[:, i:i + 1], pos[:, i:i + 1], cache, pos[:, i:i + 1], pos[:, i:i + 1, None] >= pos[:, None, :]).logits
                 for i in range(30, 40)]
    assert (prefill.logits - whole[:, :30]).abs().max().item() < 1e-8          # float64 summation order only
    assert (torch.cat(steps, dim=1) - whole[:, 30:]).abs().max().item() < 1e-8


def test_the_export_loads_in_hugging_face_with_the_same_logits(tmp_path):
    """ddtree.reference.export writes the MLA target under DeepseekV3ForCausalLM's checkpoint names
    (routed experts one by one, as Kimi's checkpoint has them): Hugging Face's own loader reads it
    with no missing or unexpected weight and gives the reference's logits."""
    from transformers import DeepseekV3ForCausalLM

    from ddtree.reference.config import DraftConfig
    from ddtree.reference.export import export_pair
    from ddtree.reference.pair import init_pair

    cfg = kimi_shaped(vocab_size=260, bos_token_id=256, eos_token_id=257)
    draft = DraftConfig(hidden_size=cfg.hidden_size, block_size=4, target_layer_ids=[0, 1], mask_token_id=258)
    pair = init_pair(cfg, draft, seed=5, std=0.05)
    export_pair(pair, tmp_path, dtype="float32")
    hf, info = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "target", torch_dtype=torch.float32,
                                                     output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokens = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = hf.eval()(input_ids=tokens).logits
        mine = pair.target.eval().forward_sequence(tokens).logits
    assert (mine - theirs).abs().max().item() < 1e-3
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))
