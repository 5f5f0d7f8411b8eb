"""Model configurations with Hugging Face style field names (config.json)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class TargetConfig:
    """A Llama/Qwen3-style decoder."""

    vocab_size: int = 260                 # byte tokenizer: 256 bytes + 4 specials
    hidden_size: int = 64                 # model width
    intermediate_size: int = 128          # SwiGLU inner width
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2          # grouped-query attention: heads share K/V in groups
    head_dim: int = 16
    max_position_embeddings: int = 1024   # context length (prompt + generated)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    bos_token_id: int = 256
    eos_token_id: int = 257
    model_type: str = "ddtree_reference_target"
    architectures: list[str] = field(default_factory=lambda: ["TargetLM"])
    # --- DeepSeek-V3 (Kimi K2.6's text model): multi-head latent attention when kv_lora_rank > 0 ---
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_scaling: dict | None = None      # DeepSeek YaRN: type, factor, original_max_position_embeddings, ...
    # --- its mixture of experts, after the first first_k_dense_replace layers, when n_routed_experts > 0 ---
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def cache_heads_dim(self) -> tuple[int, int]:
        """(heads, width) of one layer's KV slots: MLA keeps each head's key (and the value, padded)."""
        if self.is_mla:
            return self.num_attention_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.num_key_value_heads, self.head_dim

    def to_json(self) -> dict:
        out = asdict(self)
        if not self.is_mla:     # a Qwen3-style target's config.json keeps its own fields only
            for name in DEEPSEEK_FIELDS:
                out.pop(name)
        return out


DEEPSEEK_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_scaling",
                   "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size",
                   "first_k_dense_replace", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor")


@dataclass
class DraftConfig:
    """A DFlash draft: a few decoder layers over a non-causal block, conditioned on the target."""

    hidden_size: int = 64                 # must equal the target's (shared embeddings and head)
    intermediate_size: int = 128
    num_hidden_layers: int = 1
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    block_size: int = 4                   # slot 0 = bonus token, slots 1.. = mask token
    target_layer_ids: list[int] = field(default_factory=lambda: [0, 1])  # target layers fed to fc
    mask_token_id: int = 258
    model_type: str = "ddtree_reference_dflash"
    architectures: list[str] = field(default_factory=lambda: ["DFlashDraft"])

    def to_json(self) -> dict:
        out = asdict(self)
        # the DFlash convention nests the drafting parameters
        out["dflash_config"] = {"block_size": out.pop("block_size"),
                                "target_layer_ids": out.pop("target_layer_ids"),
                                "mask_token_id": out.pop("mask_token_id")}
        return out


def _from_dict(cls, data: dict, source: str):
    known = {f.name for f in fields(cls)}
    flat = dict(data)
    flat.update(flat.pop("dflash_config", {}) or {})
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ValueError(f"{source}: unknown fields {unknown}; expected a subset of {sorted(known)}")
    return cls(**flat)


def load_config(path: Path, cls):
    """Read config.json at `path` into `cls`, naming the file in every error."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: config.json not found; create the pair with "
                                "`python -m ddtree.reference.init --out DIR`") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    return _from_dict(cls, data, str(path))


PRESETS: dict[str, tuple[TargetConfig, DraftConfig]] = {
    "tiny": (TargetConfig(), DraftConfig()),
    "small": (
        TargetConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, head_dim=32, max_position_embeddings=2048),
        DraftConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=4, head_dim=32, block_size=8, target_layer_ids=[0, 2, 3]),
    ),
}
