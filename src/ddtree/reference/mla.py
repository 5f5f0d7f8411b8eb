"""The DeepSeek-V3 text model Kimi K2.6 wraps, in plain PyTorch, for the reference engine: multi-head
latent attention (MLA) with DeepSeek's YaRN rope, and a mixture of experts (sigmoid scoring with a
correction bias, grouped top-k "noaux_tc", one shared expert, the first layers dense).

Weights carry SGLang's / Hugging Face's DeepseekV3ForCausalLM names (`ddtree.reference.export`
writes them as they are). The attention keeps each head's full key and value in the reference's
KVCache (the value padded to the key's width): the cache SGLang keeps is the compressed latent,
but the attention it computes is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ddtree.reference.layers import RMSNorm, SwiGLU


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN magnitude scale: 0.1 * mscale * ln(factor) + 1 for factor > 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class YarnRope:
    """DeepSeek's YaRN rotary embedding over the rope part of each head (dim qk_rope_head_dim),
    rotating interleaved pairs (x0, x1), (x2, x3), ... (SGLang: is_neox_style=False)."""

    dim: int
    theta: float
    factor: float = 1.0                  # 1: plain RoPE
    original_max_position: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @classmethod
    def from_config(cls, cfg) -> "YarnRope":
        s = cfg.rope_scaling or {}
        if not s:
            return cls(cfg.qk_rope_head_dim, cfg.rope_theta)
        return cls(cfg.qk_rope_head_dim, cfg.rope_theta, float(s["factor"]), int(s["original_max_position_embeddings"]),
                   float(s.get("beta_fast", 32)), float(s.get("beta_slow", 1)), float(s.get("mscale", 1)),
                   float(s.get("mscale_all_dim", 0)))

    def inv_freq(self) -> torch.Tensor:
        """[dim / 2] float64: the interpolated frequencies below the correction range, the original
        ones above it, a linear ramp between."""
        base = 1.0 / self.theta ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim)
        if self.factor <= 1:
            return base

        def correction_dim(rotations: float) -> float:
            return (self.dim * math.log(self.original_max_position / (rotations * 2 * math.pi))) / (2 * math.log(self.theta))

        low = max(math.floor(correction_dim(self.beta_fast)), 0)
        high = min(math.ceil(correction_dim(self.beta_slow)), self.dim - 1)
        ramp = ((torch.arange(self.dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        keep = 1 - ramp                                                     # 1: the original frequency
        return base / self.factor * (1 - keep) + base * keep

    def cos_sin_scale(self) -> float:
        return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)

    def softmax_scale(self, qk_head_dim: int) -> float:
        """qk_head_dim^-0.5, times mscale_all_dim's magnitude scale squared under YaRN."""
        m = yarn_mscale(self.factor, self.mscale_all_dim) if self.mscale_all_dim else 1.0
        return qk_head_dim ** -0.5 * m * m

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [bs, heads, T, dim], positions int64 [bs, T] -> x rotated, pairs interleaved."""
        angle = positions.to(torch.float64)[:, None, :, None] * self.inv_freq().to(x.device)   # [bs, 1, T, dim/2]
        scale = self.cos_sin_scale()
        cos, sin = (angle.cos() * scale).to(x.dtype), (angle.sin() * scale).to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


class LatentAttention(nn.Module):
    """MLA: queries through a low-rank projection (q_a -> norm -> q_b), keys and values from one
    compressed latent (kv_a -> norm -> kv_b) plus a rope key shared by the heads."""

    def __init__(self, cfg):
        super().__init__()
        self.heads, self.nope, self.rope_dim, self.v_dim = (cfg.num_attention_heads, cfg.qk_nope_head_dim,
                                                            cfg.qk_rope_head_dim, cfg.v_head_dim)
        self.qk_dim = self.nope + self.rope_dim
        self.kv_lora_rank = cfg.kv_lora_rank
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, self.heads * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, self.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, cfg.hidden_size, bias=False)
        self.rope = YarnRope.from_config(cfg)
        self.scale = self.rope.softmax_scale(self.qk_dim)

    def query(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [bs, T, hidden] -> q [bs, H, T, nope + rope]."""
        bs, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(bs, t, self.heads, self.qk_dim).transpose(1, 2)
        return torch.cat([q[..., : self.nope], self.rope(q[..., self.nope:], positions)], dim=-1)

    def key_value(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [bs, T, hidden] -> k [bs, H, T, nope + rope], v [bs, H, T, nope + rope] (the value's
        v_head_dim, zero-padded to the key's width so one KVCache holds both)."""
        bs, t, _ = x.shape
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(bs, t, self.heads, self.nope + self.v_dim).transpose(1, 2)
        k_pe = self.rope(k_pe[:, None], positions).expand(bs, self.heads, t, self.rope_dim)   # shared by the heads
        k = torch.cat([kv[..., : self.nope], k_pe], dim=-1)
        v = F.pad(kv[..., self.nope:], (0, self.qk_dim - self.v_dim))
        return k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [bs, H, T, qk], k/v [bs, H, S, qk], mask bool [bs, T, S] (True = visible) -> [bs, T, hidden]."""
        if torch.is_grad_enabled():     # training: k/v are views of the cache the next layers write into
            k, v = k.clone(), v.clone()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.scale)   # [bs, H, T, qk]
        bs, _, t, _ = out.shape
        return self.o_proj(out[..., : self.v_dim].transpose(1, 2).reshape(bs, t, self.heads * self.v_dim))


class Router(nn.Module):
    """DeepSeek-V3's gate: sigmoid scores, the choice made on scores + a correction bias within the
    best groups (noaux_tc), the chosen raw scores normalised and scaled."""

    def __init__(self, cfg):
        super().__init__()
        self.top_k, self.groups, self.top_groups = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.norm, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_routed_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> weights [N, top_k] (float32), expert ids [N, top_k]."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()                        # [N, E]
        choice = scores + self.e_score_correction_bias.float()
        n, e = choice.shape
        per_group = choice.view(n, self.groups, e // self.groups)
        group_best = per_group.topk(min(2, e // self.groups), dim=-1).values.sum(-1)        # [N, groups]
        keep = torch.zeros_like(group_best).scatter_(1, group_best.topk(self.top_groups, dim=-1).indices, 1.0)
        choice = choice.masked_fill(~keep.bool().repeat_interleave(e // self.groups, dim=1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.norm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class MoE(nn.Module):
    """Routed experts (SwiGLU each) weighted by the router, plus the shared expert(s) for every token."""

    def __init__(self, cfg):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size)
                                     for _ in range(cfg.n_routed_experts))
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]."""
        flat = x.reshape(-1, x.shape[-1])                                                    # [N, hidden]
        weights, ids = self.gate(flat)                                                       # [N, k]
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(ids == e, as_tuple=True)
            if token.numel():
                out.index_add_(0, token, (expert(flat[token]) * weights[token, slot, None]).to(out.dtype))
        return (out + self.shared_experts(flat)).view_as(x)


class MLADecoderLayer(nn.Module):
    """Pre-norm MLA + (dense SwiGLU for the first first_k_dense_replace layers, MoE after)."""

    def __init__(self, cfg, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LatentAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size) if index < cfg.first_k_dense_replace else MoE(cfg)

    def forward(self, x, positions, cache, layer: int, slots, mask):
        h = self.input_layernorm(x)
        q = self.self_attn.query(h, positions)
        k, v = self.self_attn.key_value(h, positions)
        cache.write(layer, slots, k, v)
        x = x + self.self_attn.attend(q, cache.k[layer], cache.v[layer], mask)
        return x + self.mlp(self.post_attention_layernorm(x))
