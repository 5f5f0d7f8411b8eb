"""TargetLM: the model whose distribution speculative decoding must reproduce exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddtree.reference.cache import KVCache
from ddtree.reference.config import TargetConfig
from ddtree.reference.layers import DecoderBlock, RMSNorm
from ddtree.reference.mla import MLADecoderLayer


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [bs, T, V]
    hidden: torch.Tensor  # [bs, T, len(capture) * hidden]  outputs of the captured layers, concatenated


class DecoderLayer(DecoderBlock):
    def forward(self, x, positions, cache: KVCache, layer: int, slots, mask):
        h = self.input_layernorm(x)
        q = self.self_attn.query(h, positions)
        k, v = self.self_attn.key_value(h, positions)
        cache.write(layer, slots, k, v)
        x = x + self.self_attn.attend(q, cache.k[layer], cache.v[layer], mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TargetLM(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(MLADecoderLayer(cfg, i) if cfg.is_mla else DecoderLayer(cfg)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def new_cache(self, bs: int, slots: int) -> KVCache:
        c = self.config
        p = self.lm_head.weight
        heads, dim = c.cache_heads_dim
        return KVCache.empty(c.num_hidden_layers, bs, heads, slots, dim, p.device, p.dtype)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, slots: torch.Tensor,
                mask: torch.Tensor, capture: tuple[int, ...] = ()) -> TargetOutput:
        """One pass over T new tokens per request.

        tokens/positions/slots int64 [bs, T]; mask bool [bs, T, S] over all cache slots (the new
        tokens' own K/V are written to `slots` first, so a tree sees its ancestors there).
        """
        x = self.embed_tokens(tokens)                                  # [bs, T, hidden]
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cache, i, slots, mask)
            if i in capture:
                captured.append(x)
        hidden = torch.cat([captured[capture.index(i)] for i in capture], dim=-1) if capture else x[..., :0]
        return TargetOutput(logits=self.lm_head(self.norm(x)), hidden=hidden)

    def forward_sequence(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()) -> TargetOutput:
        """Training / offline form: causal pass over whole sequences tokens [bs, T] at positions 0..T-1."""
        bs, t = tokens.shape
        pos = torch.arange(t, device=tokens.device).expand(bs, t)
        causal = (pos[:, :, None] >= pos[:, None, :])                  # [bs, T, T]
        cache = self.new_cache(bs, t)
        kind = tokens.device.type
        if torch.is_autocast_enabled(kind):                            # K/V come out in the autocast dtype
            dtype = torch.get_autocast_dtype(kind)
            cache = KVCache(k=cache.k.to(dtype), v=cache.v.to(dtype))
        return self(tokens, pos, cache, pos, causal, capture=capture)
