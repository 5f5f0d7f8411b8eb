"""Small reference pairs for the engine tests (float64 on the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from ddtree.reference import init_pair
from ddtree.reference.config import PRESETS


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


@pytest.fixture(scope="session")
def pair8():
    return small_vocab_pair()
