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

    def working_cache(self, bs: int, slots: int) -> KVCache:
        """new_cache, in the autocast dtype where autocast is on (K/V come out in it)."""
        cache = self.new_cache(bs, slots)
        kind = cache.k.device.type
        if torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
            cache = KVCache(k=cache.k.to(dtype), v=cache.v.to(dtype))
        return cache

    def forward_sequence(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()) -> TargetOutput:
        """Training / offline form: causal pass over whole sequences tokens [bs, T] at positions 0..T-1."""
        bs, t = tokens.shape
        pos = torch.arange(t, device=tokens.device).expand(bs, t)
        causal = (pos[:, :, None] >= pos[:, None, :])                  # [bs, T, T]
        return self(tokens, pos, self.working_cache(bs, t), pos, causal, capture=capture)

    @torch.no_grad()
    def greedy_continue(self, prefix: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """prefix int64 [bs, P] followed by its greedy (argmax) continuation of new_tokens, decoded with a KV cache
        -> int64 [bs, P + new_tokens]. Offline and training use (train_pair's distillation, offline checks)."""
        bs, p = prefix.shape
        total = p + new_tokens
        cache = self.working_cache(bs, total)
        slots = torch.arange(total, device=prefix.device)                           # [S]
        pos = slots[:p].expand(bs, p)                                                 # [bs, P]
        logits = self(prefix, pos, cache, pos, pos[:, :, None] >= slots).logits       # [bs, P, V]
        out = [prefix, logits[:, -1].argmax(-1, keepdim=True)]                        # [bs, 1]
        for t in range(p, total - 1):
            at = slots[t:t + 1].expand(bs, 1)                                         # [bs, 1]
            logits = self(out[-1], at, cache, at, at[:, :, None] >= slots).logits     # [bs, 1, V]
            out.append(logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(out, dim=1)[:, :total]
