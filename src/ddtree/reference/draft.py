"""DFlashDraft: one forward pass drafts a whole block (see docs/ddtree.md).

Context: the target's hidden states of chosen layers at every verified token, concatenated,
projected by `fc` and normalised, are injected as extra keys/values in every draft layer.
Block: slot 0 = embedding of the last verified ("bonus") token, slots 1.. = the mask token;
attention inside the block is non-causal, queries come from the block only. Embeddings and LM
head are the target's. Row d-1 of the output (slot d) is the draft's marginal for depth d.
"""

from __future__ import annotations

import torch
from torch import nn

from ddtree.reference.cache import KVCache
from ddtree.reference.config import DraftConfig
from ddtree.reference.layers import DecoderBlock, RMSNorm


class DraftLayer(DecoderBlock):
    def forward(self, x, positions, ctx_k, ctx_v, mask):
        """x [bs, Q, hidden] (Q block queries); ctx_k/v [bs, KV, S, hd]; mask bool [bs, Q, S + Q]."""
        h = self.input_layernorm(x)
        q = self.self_attn.query(h, positions)
        k, v = self.self_attn.key_value(h, positions)                   # block K/V [bs, KV, Q, hd]
        keys = torch.cat([ctx_k, k], dim=2)
        values = torch.cat([ctx_v, v], dim=2)
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

    def new_context(self, bs: int, slots: int) -> KVCache:
        """The draft's context for a batch: the K/V of every draft layer over the verified tokens
        (slot s = the verified token at position s), a KVCache like the target's."""
        c = self.config
        p = self.fc.weight
        return KVCache.empty(c.num_hidden_layers, bs, c.num_key_value_heads, slots, c.head_dim, p.device, p.dtype)

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Target hidden states [bs, T, n*hidden] -> the draft's context features [bs, T, hidden]."""
        return self.hidden_norm(self.fc(target_hidden))

    def extend_context(self, ctx: KVCache, target_hidden: torch.Tensor, positions: torch.Tensor,
                       slots: torch.Tensor) -> None:
        """Add verified tokens: target_hidden [bs, T, n*hidden] at positions/slots [bs, T] (mutates ctx)."""
        c = self.project_context(target_hidden)                         # [bs, T, hidden]
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.key_value(c, positions)              # [bs, KV, T, hd]
            ctx.write(i, slots, k, v)

    def block_tokens(self, roots: torch.Tensor) -> torch.Tensor:
        """roots int64 [...] -> blocks [..., B]: the root (bonus) token, then the mask token."""
        tokens = torch.full((*roots.shape, self.config.block_size), self.config.mask_token_id,
                            dtype=torch.int64, device=roots.device)
        tokens[..., 0] = roots
        return tokens

    def _run_blocks(self, tokens, positions, ctx_kv, mask) -> torch.Tensor:
        """tokens/positions [bs, Q]; ctx_kv: per layer (k, v) [bs, KV, S, hd]; mask [bs, Q, S + Q] -> [bs, Q, hidden]."""
        embed, _ = self._shared
        x = embed(tokens)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, positions, k, v, mask)
        return self.norm(x)

    def forward(self, root_tokens: torch.Tensor, root_positions: torch.Tensor, ctx: KVCache,
                ctx_len: torch.Tensor) -> torch.Tensor:
        """Draft logits [bs, L, V] (L = block_size - 1) for depths 1..L after root_tokens [bs]."""
        _, lm_head = self._shared
        bs = root_tokens.shape[0]
        block = self.config.block_size
        dev = root_tokens.device
        tokens = self.block_tokens(root_tokens)                         # [bs, B]; slot 0 = bonus token
        positions = root_positions[:, None] + torch.arange(block, device=dev)
        ctx_mask = torch.arange(ctx.k.shape[3], device=dev)[None, :] < ctx_len[:, None]       # [bs, S]
        block_visible = torch.ones(bs, block, block, dtype=torch.bool, device=dev)            # non-causal
        mask = torch.cat([ctx_mask[:, None, :].expand(bs, block, -1), block_visible], dim=2)
        x = self._run_blocks(tokens, positions, list(zip(ctx.k, ctx.v)), mask)
        return lm_head(x[:, 1:])                                        # [bs, B-1, V]

    def block_logits(self, target_hidden: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Training / offline form: K blocks per sequence in one pass.

        target_hidden [bs, T, n*hidden] of tokens [bs, T] (positions 0..T-1); anchors int64 [bs, K]:
        block k has root tokens[a_k] at position a_k and sees the context positions < a_k, as the
        decoder's draft pass does when a_k tokens are cached. -> logits [bs, K, L, V] for depths 1..L.
        """
        _, lm_head = self._shared
        bs, t, _ = target_hidden.shape
        k_blocks, block = anchors.shape[1], self.config.block_size
        dev = tokens.device
        c = self.project_context(target_hidden)                         # [bs, T, hidden]
        ctx_pos = torch.arange(t, device=dev).expand(bs, t)
        ctx_kv = [layer.self_attn.key_value(c, ctx_pos) for layer in self.layers]
        roots = tokens.gather(1, anchors)                               # [bs, K]
        blocks = self.block_tokens(roots).reshape(bs, k_blocks * block)  # [bs, Q]
        positions = (anchors[:, :, None] + torch.arange(block, device=dev)).reshape(bs, -1)
        see_ctx = ctx_pos[:, None, :] < anchors.repeat_interleave(block, dim=1)[:, :, None]    # [bs, Q, T]
        owner = torch.arange(k_blocks, device=dev).repeat_interleave(block)                   # [Q]
        same_block = (owner[:, None] == owner[None, :]).expand(bs, -1, -1)                     # [bs, Q, Q]
        x = self._run_blocks(blocks, positions, ctx_kv, torch.cat([see_ctx, same_block], dim=2))
        return lm_head(x.view(bs, k_blocks, block, -1)[:, :, 1:])      # [bs, K, L, V]
