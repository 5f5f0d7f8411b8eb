"""A toy language model pair keyed by a rolling hash of the context (tests only).

Logits are rows of fixed random tables indexed by hash(context), so a context always gets the
same distribution, whether it is reached by plain decoding or through a draft tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRIME = 1009
MULT = 131


def fold(h: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Rolling hash update, int64 tensors of one shape."""
    return (h * MULT + token + 1) % PRIME


def fold_py(h: int, token: int) -> int:
    return (h * MULT + token + 1) % PRIME


@dataclass
class ToyPair:
    target: torch.Tensor  # float32 [PRIME, V]
    draft: torch.Tensor   # float32 [PRIME, L, V]

    @classmethod
    def make(cls, vocab: int, max_depth: int, seed: int, scale: float = 2.0) -> "ToyPair":
        g = torch.Generator().manual_seed(seed)
        target = torch.randn(PRIME, vocab, generator=g) * scale
        # the draft is a noisy copy of the target one step ahead, so trees accept often
        draft = torch.randn(PRIME, max_depth, vocab, generator=g) * scale
        return cls(target=target, draft=draft)

    def node_hashes(self, tree, ctx_hash: torch.Tensor) -> torch.Tensor:
        """Hash of context + path for every node; ctx_hash int64 [bs] includes the root token."""
        bs, n = tree.tokens.shape
        h = ctx_hash[:, None].expand(bs, n).clone()
        for _ in range(tree.max_depth):  # parents first: depth d settles after d passes
            parent_h = h.gather(1, tree.parents.clamp(min=0))
            h = torch.where(tree.parents >= 0, fold(parent_h, tree.tokens), ctx_hash[:, None])
        return h
