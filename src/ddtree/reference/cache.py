"""KVCache: the key/value slots the reference target and the DFlash draft both keep."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Per-layer key/value slots of a batch; slot s of request b holds its token at position s.

    The target's KV cache, and the draft's context (the K/V of the target's hidden states that
    every draft layer attends to) alike.
    """

    k: torch.Tensor  # [layers, bs, kv_heads, S, hd]
    v: torch.Tensor  # [layers, bs, kv_heads, S, hd]

    @classmethod
    def empty(cls, layers: int, bs: int, kv_heads: int, slots: int, head_dim: int,
              device: torch.device | str, dtype: torch.dtype) -> "KVCache":
        shape = (layers, bs, kv_heads, slots, head_dim)
        return cls(k=torch.zeros(shape, device=device, dtype=dtype), v=torch.zeros(shape, device=device, dtype=dtype))

    def rows(self, n: int) -> "KVCache":
        """A view of the first n requests' slots (a batch bound to a larger graph bucket)."""
        return KVCache(k=self.k[:, :n], v=self.v[:, :n])

    @property
    def slots(self) -> int:
        return self.k.shape[3]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [bs, KV, T, hd] at slots int64 [bs, T] (mutates the cache)."""
        index = slots[:, None, :, None].expand_as(k)
        self.k[layer].scatter_(2, index, k.to(self.k.dtype))     # under autocast k and v can differ
        self.v[layer].scatter_(2, index, v.to(self.v.dtype))

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots src -> dst (int64 [bs, T]) in every layer; all reads happen before writes."""
        layers, bs, kvh, _, hd = self.k.shape
        index = src[None, :, None, :, None].expand(layers, bs, kvh, src.shape[1], hd)
        k, v = self.k.gather(3, index), self.v.gather(3, index)
        out = dst[None, :, None, :, None].expand_as(index)
        self.k.scatter_(3, out, k)
        self.v.scatter_(3, out, v)
