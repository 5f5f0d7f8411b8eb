"""DFlashDraft: one forward pass drafts a whole block (see ../shared/docs/ddtree.md).

Context: the target's hidden states of chosen layers at every verified token, concatenated,
projected by `fc` and normalised, are injected as extra keys/values in every draft layer.
Block: slot 0 = embedding of the last verified ("bonus") token, slots 1.. = the mask token;
attention inside the block is non-causal, queries come from the block only. Embeddings and LM
head are the target's. Row d-1 of the output (slot d) is the draft's marginal for depth d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddtree.reference.config import DraftConfig
from ddtree.reference.layers import DecoderBlock, RMSNorm


@dataclass
class DraftContext:
    """Context K/V of every draft layer for a batch; slot s = the verified token at position s."""

    k: torch.Tensor  # [layers, bs, kv_heads, S, hd]
    v: torch.Tensor  # [layers, bs, kv_heads, S, hd]


class DraftLayer(DecoderBlock):
    def forward(self, x, positions, ctx_k, ctx_v, ctx_mask):
        """x [bs, B, hidden]; ctx_k/v [bs, KV, S, hd]; ctx_mask bool [bs, S]."""
        bs, block, _ = x.shape
        h = self.input_layernorm(x)
        q = self.self_attn.query(h, positions)
        k, v = self.self_attn.key_value(h, positions)                   # block K/V [bs, KV, B, hd]
        keys = torch.cat([ctx_k, k], dim=2)
        values = torch.cat([ctx_v, v], dim=2)
        block_visible = torch.ones(bs, block, block, dtype=torch.bool, device=x.device)  # non-causal
        mask = torch.cat([ctx_mask[:, None, :].expand(bs, block, -1), block_visible], dim=2)
        x = x + self.self_attn.attend(q, keys, values, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DraftConfig, target_hidden_size: int, embed_tokens: nn.Embedding,
                 lm_head: nn.Linear):
        super().__init__()
        if cfg.hidden_size != target_hidden_size:
            raise ValueError(f"draft hidden_size={cfg.hidden_size} must equal the target's "
                             f"({target_hidden_size}): embeddings and LM head are shared")
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # shared with the target, not part of the draft's own weights
        object.__setattr__(self, "_shared", (embed_tokens, lm_head))

    def new_context(self, bs: int, slots: int) -> DraftContext:
        c = self.config
        p = self.fc.weight
        shape = (c.num_hidden_layers, bs, c.num_key_value_heads, slots, c.head_dim)
        return DraftContext(k=torch.zeros(shape, device=p.device, dtype=p.dtype),
                            v=torch.zeros(shape, device=p.device, dtype=p.dtype))

    def extend_context(self, ctx: DraftContext, target_hidden: torch.Tensor, positions: torch.Tensor,
                       slots: torch.Tensor) -> None:
        """Add verified tokens: target_hidden [bs, T, n*hidden] at positions/slots [bs, T] (mutates ctx)."""
        c = self.hidden_norm(self.fc(target_hidden))                    # [bs, T, hidden]
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.key_value(c, positions)              # [bs, KV, T, hd]
            index = slots[:, None, :, None].expand_as(k)
            ctx.k[i].scatter_(2, index, k)
            ctx.v[i].scatter_(2, index, v)

    def forward(self, root_tokens: torch.Tensor, root_positions: torch.Tensor, ctx: DraftContext,
                ctx_len: torch.Tensor) -> torch.Tensor:
        """Draft logits [bs, L, V] (L = block_size - 1) for depths 1..L after root_tokens [bs]."""
        embed, lm_head = self._shared
        bs = root_tokens.shape[0]
        block = self.config.block_size
        tokens = torch.full((bs, block), self.config.mask_token_id, dtype=torch.int64, device=root_tokens.device)
        tokens[:, 0] = root_tokens                                      # slot 0 = bonus token
        positions = root_positions[:, None] + torch.arange(block, device=root_tokens.device)
        ctx_mask = torch.arange(ctx.k.shape[3], device=root_tokens.device)[None, :] < ctx_len[:, None]
        x = embed(tokens)                                               # [bs, B, hidden]
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, ctx.k[i], ctx.v[i], ctx_mask)
        return lm_head(self.norm(x[:, 1:]))                             # [bs, B-1, V]
