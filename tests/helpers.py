"""Assertions shared by the CPU and GPU tests."""

from __future__ import annotations

import torch

TREE_FIELDS = ("tokens", "parents", "depths", "num_nodes", "ancestor_mask")
VERDICT_FIELDS = ("accepted", "accept_len", "bonus", "tokens")


def assert_same_tree(a, b, atol: float = 1e-5) -> None:
    """Two DraftTrees are identical (scores within atol: fp32 sums in another order)."""
    for field in TREE_FIELDS:
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert torch.allclose(a.scores, b.scores, atol=atol)


def assert_same_verdict(a, b) -> None:
    for field in VERDICT_FIELDS:
        assert torch.equal(getattr(a, field), getattr(b, field)), field
