"""Small reference pairs for the engine tests (float64 on the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from ddtree.reference import init_pair
from ddtree.reference.config import PRESETS, DraftConfig, TargetConfig


def small_vocab_pair(vocab: int = 8, seed: int = 0, std: float = 0.2, block_size: int = 4):
    """The tiny preset with a small vocabulary, so random drafts get accepted now and then."""
    target_cfg, draft_cfg = copy.deepcopy(PRESETS["tiny"])
    target_cfg.vocab_size = vocab
    target_cfg.bos_token_id, target_cfg.eos_token_id = 0, 1
    draft_cfg.mask_token_id = vocab - 1
    draft_cfg.block_size = block_size
    pair = init_pair(target_cfg, draft_cfg, seed, std=std)
    pair.target.to(torch.float64)
    pair.draft.to(torch.float64)
    return pair


YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 64, "beta_fast": 1.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0}


def kimi_shaped_configs(vocab_size: int = 260, block_size: int = 4, mask_token_id: int = 258, bos_token_id: int = 256,
                        eos_token_id: int = 257) -> tuple[TargetConfig, DraftConfig]:
    """A Kimi-shaped pair at test size: an MLA + MoE (8 experts, top 2, a shared expert, 1 dense layer) + YaRN
    target of 4 layers and a draft reading three of its layers."""
    target = TargetConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=4, head_dim=48, max_position_embeddings=512, q_lora_rank=32,
                          kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24, rope_theta=50000.0,
                          rope_scaling=dict(YARN), n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                          moe_intermediate_size=40, first_k_dense_replace=1, routed_scaling_factor=2.5,
                          vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    draft = DraftConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=1, head_dim=8, block_size=block_size,
                        target_layer_ids=[0, 1, 2], mask_token_id=mask_token_id)
    return target, draft


@pytest.fixture(scope="session")
def pair8():
    return small_vocab_pair()


@pytest.fixture(scope="session")
def kimi_pair():
    """The Kimi-shaped pair of kimi_shaped_configs, random weights, in float64."""
    pair = init_pair(*kimi_shaped_configs(), seed=11, std=0.08)
    pair.target.double()
    pair.draft.double()
    return pair
