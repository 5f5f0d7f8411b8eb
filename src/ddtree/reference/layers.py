"""Decoder building blocks shared by the target and the draft (one class per concept)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (half-rotation). x [bs, heads, T, hd], positions int64 [bs, T]."""
    hd = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float64) / hd)
    angle = positions.to(torch.float64)[:, None, :, None] * inv_freq          # [bs, 1, T, hd/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention with per-head q/k RMSNorm (Qwen3 style) and RoPE."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, theta: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def query(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [bs, T, hidden] -> q [bs, heads, T, hd] with RoPE."""
        bs, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(bs, t, self.heads, self.head_dim)).transpose(1, 2)
        return rope(q, positions, self.theta)

    def key_value(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [bs, T, hidden] -> k, v [bs, kv_heads, T, hd] (k with RoPE)."""
        bs, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(bs, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(bs, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return rope(k, positions, self.theta), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [bs, H, T, hd], k/v [bs, KV, S, hd], mask bool [bs, T, S] (True = visible) -> [bs, T, hidden]."""
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)                                      # [bs, H, S, hd]
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])     # [bs, H, T, hd]
        bs, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(bs, t, self.heads * self.head_dim))


class DecoderBlock(nn.Module):
    """Pre-norm attention + SwiGLU block; the target and the draft differ only in what they attend to.

    cfg: a TargetConfig or DraftConfig (hidden_size, heads, kv heads, head_dim, eps, theta, inner size).
    """

    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
