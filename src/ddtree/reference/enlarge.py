"""A trained Kimi-shaped pair made as costly as one TP-8 rank of Kimi K2.6 without changing what it computes (issue 69).

The small pair's tokens, the rank's forward cost: every width grows to the rank's with zero rows and columns, and what
the zeros would change is put back.
  hidden     embeddings, every projection that reads or writes the residual stream padded with zeros: the added
             dimensions stay exactly 0 through every layer. An RMSNorm over the wider stream sees the same sum of
             squares over more dimensions, so its weight is scaled by sqrt(small / big) and the model's eps by
             small / big (the norms over q_lora and the KV latent share that eps: their output moves by at most
             eps / (2 x their mean square), below bf16's resolution).
  heads      added query heads with zero queries, keys and values and zero output columns: they add exactly 0.
  q_lora, the dense MLP   zero rows and columns (silu(0) x 0 = 0).
  experts    added experts whose router rows are zero and whose correction bias is NEVER_BIAS: the routers never
             pick them, so every token takes the small pair's experts with the small pair's weights.
  vocabulary added tokens whose LM-head row copies the filler token's (by default the mask token, which a target
             never predicts): their logit ties the filler's, so the greedy choice never moves to one of them (ties go
             to the lower id). They take probability mass at temperature > 0: compare samples on the enlarged pair.
  layers     extra MoE layers after the small pair's, with random attention and random routers over all experts (so
             they read experts as the rank does, chosen from the pair's own hidden states) whose output projections
             (attention o_proj, every expert's down_proj) are zero: each adds exactly 0 to the residual stream.
The draft widens alike (its fc reads each captured layer's first `small hidden` columns), its target layer ids kept.

    tensors = enlarged_target_tensors(pair, Enlargement(hidden=7168, ...), FloatExperts())   # name -> tensor
    python3 -m ddtree.reference.enlarge --pair DIR --out DIR [--extra-layers 32] [--int4-experts]

writes the enlarged pair in SGLang's formats (DeepseekV3ForCausalLM + DFlashDraftModel), one safetensors shard per
layer, the routed experts in Kimi's INT4 with --int4-experts (the real experts quantized as `export --int4-experts`
quantizes them, so the enlarged INT4 pair computes what the small INT4 pair does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from ddtree.reference.config import DraftConfig, TargetConfig
from ddtree.reference.pair import Pair, load_pair

NEVER_BIAS = -1.0e4          # an added expert's correction bias: below any score in (0, 1) plus a trained bias


@dataclass(frozen=True)
class Enlargement:
    """The enlarged pair's widths (default: one TP-8 rank of Kimi K2.6) and how many extra MoE layers it gets."""
    hidden: int = 7168
    heads: int = 8
    q_lora: int = 1536
    dense_inter: int = 2304
    experts: int = 384
    vocab: int = 20480
    extra_layers: int = 32
    filler_token: int = 258          # the LM-head row the added tokens copy (ByteTokenizer's mask token)
    seed: int = 0

    def problems(self, cfg: TargetConfig) -> list[str]:
        """What stops this enlargement of a target `cfg`, each naming the setting, the values and the fix."""
        out = []
        for field, small in (("hidden", cfg.hidden_size), ("heads", cfg.num_attention_heads),
                             ("q_lora", cfg.q_lora_rank), ("dense_inter", cfg.intermediate_size),
                             ("experts", cfg.n_routed_experts), ("vocab", cfg.vocab_size)):
            if getattr(self, field) < small:
                out.append(f"{field} {getattr(self, field)} is below the small pair's {small}: an enlargement only "
                           "widens; give at least the small pair's width")
        if not (cfg.is_mla and cfg.n_routed_experts):
            out.append("the target is not MLA + MoE (kv_lora_rank and n_routed_experts are 0): enlarge a Kimi-shaped "
                       "pair (training/train_pair.py --size kimi-allexp)")
        if cfg.n_group != 1 or cfg.topk_group != 1:
            out.append(f"n_group {cfg.n_group} / topk_group {cfg.topk_group}: added experts would change the groups; "
                       "enlarge a pair routed in one group (n_group = topk_group = 1, as Kimi K2.6)")
        if self.extra_layers < 0:
            out.append(f"extra_layers {self.extra_layers} is negative: give 0 or more")
        if not 0 <= self.filler_token < cfg.vocab_size:
            out.append(f"filler_token {self.filler_token} is not a token of the small pair (0..{cfg.vocab_size - 1})")
        return out


def check(cfg: TargetConfig, big: Enlargement) -> None:
    problems = big.problems(cfg)
    if problems:
        raise ValueError("; ".join(problems))


def norm_scale(small: int, big: int) -> float:
    """An RMSNorm's weight factor when its input gains big - small zero dimensions."""
    return math.sqrt(small / big)


def widen_projection(name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """A projection that reads the residual stream (q/k/v, gate, up: zero columns) or writes it (o, down: zero rows)."""
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
        return pad(t, (t.shape[0], hidden))
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return pad(t, (hidden, t.shape[1]))
    raise ValueError(f"tensor {name!r} has no enlargement rule (a layout this module does not know)")


def enlarged_target_config(cfg: TargetConfig, big: Enlargement) -> TargetConfig:
    return replace(cfg, hidden_size=big.hidden, num_attention_heads=big.heads, num_key_value_heads=big.heads,
                   q_lora_rank=big.q_lora, intermediate_size=big.dense_inter, n_routed_experts=big.experts,
                   vocab_size=big.vocab, num_hidden_layers=cfg.num_hidden_layers + big.extra_layers,
                   rms_norm_eps=cfg.rms_norm_eps * cfg.hidden_size / big.hidden)


def enlarged_draft_config(dcfg: DraftConfig, cfg: TargetConfig, big: Enlargement) -> DraftConfig:
    return replace(dcfg, hidden_size=big.hidden, rms_norm_eps=dcfg.rms_norm_eps * cfg.hidden_size / big.hidden)


def pad(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """t in the leading corner of a zero tensor of `shape`."""
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


# --- routed experts: float (the reference, CPU tests) or Kimi's INT4 (the GPU's rank-sized pair) ---------------------

class FloatExperts:
    """Expert projections as float tensors (name -> weight)."""

    def real(self, stem: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        return {stem + "weight": weight}

    def zero(self, stem: str, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        return {stem + "weight": torch.zeros(shape)}

    def random(self, stem: str, shape: tuple[int, int], std: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {stem + "weight": torch.randn(shape, generator=gen) * std}


class Int4Experts:
    """Expert projections as compressed-tensors W4A16 packs (export.int4_pack): the trained ones quantized as the
    small INT4 export quantizes them; zeros and random ones made packed (one zero pack per shape, reused)."""

    def __init__(self):
        self._zeros: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def real(self, stem: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        from ddtree.reference.export import int4_pack

        return {stem + k: v for k, v in int4_pack(weight).items()}

    def zero(self, stem: str, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        from ddtree.reference.export import int4_pack

        if shape not in self._zeros:
            self._zeros[shape] = int4_pack(torch.zeros(shape))
        return {stem + k: v.clone() for k, v in self._zeros[shape].items()}

    def random(self, stem: str, shape: tuple[int, int], std: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """Uniform 4-bit codes (any int32 is eight valid codes) and one scale: weights of about `std`."""
        from ddtree.reference.export import INT4_GROUP

        out_features, in_features = shape
        packed = torch.randint(-2**31, 2**31 - 1, (out_features, in_features // 8), generator=gen, dtype=torch.int64)
        scale = torch.full((out_features, in_features // INT4_GROUP), std / 4.6)      # codes -8..7: std ~4.6
        return {stem + "weight_packed": packed.to(torch.int32), stem + "weight_scale": scale,
                stem + "weight_shape": torch.tensor(list(shape), dtype=torch.int32)}


# --- the target -------------------------------------------------------------------------------------------------------

def widen_target_tensor(rest: str, t: torch.Tensor, cfg: TargetConfig, big: Enlargement) -> torch.Tensor:
    """One non-expert tensor of a small layer (its name after `layers.i.`) at the enlarged widths."""
    h, hs = big.hidden, norm_scale(cfg.hidden_size, big.hidden)
    qk, nope_v = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim
    if rest in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        return pad(t * hs, (h,))
    attn = {"self_attn.q_a_proj.weight": lambda: pad(t, (big.q_lora, h)),
            "self_attn.q_a_layernorm.weight": lambda: pad(t * norm_scale(cfg.q_lora_rank, big.q_lora), (big.q_lora,)),
            "self_attn.q_b_proj.weight": lambda: pad(t.view(cfg.num_attention_heads, qk, cfg.q_lora_rank),
                                                     (big.heads, qk, big.q_lora)).reshape(big.heads * qk, big.q_lora),
            "self_attn.kv_a_proj_with_mqa.weight": lambda: pad(t, (t.shape[0], h)),
            "self_attn.kv_a_layernorm.weight": lambda: t,
            "self_attn.kv_b_proj.weight": lambda: pad(t.view(cfg.num_attention_heads, nope_v, cfg.kv_lora_rank),
                                                      (big.heads, nope_v, cfg.kv_lora_rank)).reshape(-1, cfg.kv_lora_rank),
            "self_attn.o_proj.weight": lambda: pad(t.view(cfg.hidden_size, cfg.num_attention_heads, cfg.v_head_dim),
                                                   (h, big.heads, cfg.v_head_dim)).reshape(h, -1),
            "mlp.gate_proj.weight": lambda: pad(t, (big.dense_inter, h)),
            "mlp.up_proj.weight": lambda: pad(t, (big.dense_inter, h)),
            "mlp.down_proj.weight": lambda: pad(t, (h, big.dense_inter)),
            "mlp.gate.weight": lambda: pad(t, (big.experts, h)),
            "mlp.gate.e_score_correction_bias": lambda: torch.cat(
                [t, t.new_full((big.experts - cfg.n_routed_experts,), NEVER_BIAS)])}
    if rest not in attn:
        raise ValueError(f"layer tensor {rest!r} has no enlargement rule (a target layout this module does not know)")
    return attn[rest]()


def expert_tensors(prefix: str, layer: torch.nn.Module, cfg: TargetConfig, big: Enlargement,
                   experts) -> dict[str, torch.Tensor]:
    """The MoE layer's routed experts (the small pair's widened, then zeros the router never picks) and its shared
    expert, widened."""
    h, inner = big.hidden, cfg.moe_intermediate_size
    out: dict[str, torch.Tensor] = {}
    for e in range(big.experts):
        for proj, shape in (("gate_proj", (inner, h)), ("up_proj", (inner, h)), ("down_proj", (h, inner))):
            stem = f"{prefix}mlp.experts.{e}.{proj}."
            if e < cfg.n_routed_experts:
                out.update(experts.real(stem, widen_projection(stem + "weight",
                                                               getattr(layer.mlp.experts[e], proj).weight.detach(), h)))
            else:
                out.update(experts.zero(stem, shape))
    for proj in ("gate_proj", "up_proj", "down_proj"):
        name = f"{prefix}mlp.shared_experts.{proj}.weight"
        out[name] = widen_projection(name, getattr(layer.mlp.shared_experts, proj).weight.detach(), h)
    return out


def small_layer_tensors(i: int, pair: Pair, big: Enlargement, experts) -> dict[str, torch.Tensor]:
    """Layer i of the small target at the enlarged widths (reference names, `layers.i.` prefix)."""
    cfg, layer, prefix = pair.target.config, pair.target.layers[i], f"layers.{i}."
    out = {}
    for name, t in layer.state_dict().items():
        if ".experts." in name or "shared_experts" in name:
            continue
        out[prefix + name] = widen_target_tensor(name, t.detach().float(), cfg, big)
    if hasattr(layer.mlp, "experts"):
        out.update(expert_tensors(prefix, layer, cfg, big, experts))
    return out


def extra_layer_tensors(i: int, cfg: TargetConfig, big: Enlargement, experts) -> dict[str, torch.Tensor]:
    """An extra MoE layer (index i): random attention and routers reading the live dimensions, zero output
    projections. Its own generator (seed, i): layers are made one at a time, each the same however many are made."""
    gen = torch.Generator().manual_seed(big.seed * 1_000_003 + i)
    h, hs, prefix = big.hidden, norm_scale(cfg.hidden_size, big.hidden), f"layers.{i}."
    qk, nope_v, inner = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim,
                         cfg.moe_intermediate_size)

    def rand(*shape: int, fan_in: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) / math.sqrt(fan_in)

    out = {prefix + "input_layernorm.weight": torch.full((h,), hs),
           prefix + "post_attention_layernorm.weight": torch.full((h,), hs),
           prefix + "self_attn.q_a_proj.weight": rand(big.q_lora, h, fan_in=cfg.hidden_size),
           prefix + "self_attn.q_a_layernorm.weight": torch.ones(big.q_lora),
           prefix + "self_attn.q_b_proj.weight": rand(big.heads * qk, big.q_lora, fan_in=big.q_lora),
           prefix + "self_attn.kv_a_proj_with_mqa.weight": rand(cfg.kv_lora_rank + cfg.qk_rope_head_dim, h,
                                                                fan_in=cfg.hidden_size),
           prefix + "self_attn.kv_a_layernorm.weight": torch.ones(cfg.kv_lora_rank),
           prefix + "self_attn.kv_b_proj.weight": rand(big.heads * nope_v, cfg.kv_lora_rank, fan_in=cfg.kv_lora_rank),
           prefix + "self_attn.o_proj.weight": torch.zeros(h, big.heads * cfg.v_head_dim),
           # a router over every expert reading the live dimensions: logits of about 1.5 standard deviations
           prefix + "mlp.gate.weight": rand(big.experts, h, fan_in=cfg.hidden_size) * 1.5,
           prefix + "mlp.gate.e_score_correction_bias": torch.zeros(big.experts),
           prefix + "mlp.shared_experts.gate_proj.weight": rand(inner, h, fan_in=cfg.hidden_size),
           prefix + "mlp.shared_experts.up_proj.weight": rand(inner, h, fan_in=cfg.hidden_size),
           prefix + "mlp.shared_experts.down_proj.weight": torch.zeros(h, inner)}
    for e in range(big.experts):
        stem = f"{prefix}mlp.experts.{e}."
        out.update(experts.random(stem + "gate_proj.", (inner, h), 1 / math.sqrt(cfg.hidden_size), gen))
        out.update(experts.random(stem + "up_proj.", (inner, h), 1 / math.sqrt(cfg.hidden_size), gen))
        out.update(experts.zero(stem + "down_proj.", (h, inner)))
    return out


def global_target_tensors(pair: Pair, big: Enlargement) -> dict[str, torch.Tensor]:
    """Embeddings (added tokens' rows zero), the final norm, and the LM head (added rows copy the filler's)."""
    t, cfg = pair.target, pair.target.config
    head = pad(t.lm_head.weight.detach().float(), (big.vocab, big.hidden))
    head[cfg.vocab_size:] = head[big.filler_token]
    return {"embed_tokens.weight": pad(t.embed_tokens.weight.detach().float(), (big.vocab, big.hidden)),
            "norm.weight": pad(t.norm.weight.detach().float() * norm_scale(cfg.hidden_size, big.hidden), (big.hidden,)),
            "lm_head.weight": head}


def enlarged_target_layers(pair: Pair, big: Enlargement, experts) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(layer index, its tensors) for every layer of the enlarged target, the small pair's first."""
    cfg = pair.target.config
    check(cfg, big)
    for i in range(cfg.num_hidden_layers):
        yield i, small_layer_tensors(i, pair, big, experts)
    for i in range(cfg.num_hidden_layers, cfg.num_hidden_layers + big.extra_layers):
        yield i, extra_layer_tensors(i, cfg, big, experts)


def enlarged_target_tensors(pair: Pair, big: Enlargement, experts=None) -> dict[str, torch.Tensor]:
    """The whole enlarged target, reference names (TargetLM.load_state_dict takes it; float experts by default)."""
    check(pair.target.config, big)
    out = global_target_tensors(pair, big)
    for _, tensors in enlarged_target_layers(pair, big, experts or FloatExperts()):
        out.update(tensors)
    return out


# --- the draft --------------------------------------------------------------------------------------------------------

def widen_draft_tensor(name: str, t: torch.Tensor, cfg: TargetConfig, dcfg: DraftConfig,
                       big: Enlargement) -> torch.Tensor:
    h, hs = big.hidden, norm_scale(cfg.hidden_size, big.hidden)
    if name == "fc.weight":                                              # [H, n x H] per captured layer
        n = len(dcfg.target_layer_ids)
        return pad(t.view(dcfg.hidden_size, n, cfg.hidden_size), (h, n, h)).reshape(h, n * h)
    if name.endswith(("q_norm.weight", "k_norm.weight")):                # per head: its width is kept
        return t
    if name.endswith("norm.weight"):                                     # over the residual stream
        return pad(t * hs, (h,))
    return widen_projection(name, t, h)


def enlarged_draft_tensors(pair: Pair, big: Enlargement) -> dict[str, torch.Tensor]:
    cfg, dcfg = pair.target.config, pair.draft.config
    return {name: widen_draft_tensor(name, t.detach().float(), cfg, dcfg, big)
            for name, t in pair.draft.state_dict().items()}


# --- SGLang's formats, one shard per layer -----------------------------------------------------------------------------

def sglang_name(name: str) -> str:
    """A reference target tensor's DeepseekV3ForCausalLM name."""
    return name if name.startswith("lm_head.") else "model." + name


def write_enlarged(pair: Pair, out: Path, big: Enlargement, int4: bool, dtype: torch.dtype = torch.bfloat16) -> dict:
    """OUT/target (config.json, model-LLL.safetensors per layer + globals, the index) and OUT/draft, in SGLang's
    formats; returns the enlarged target's config.json."""
    from ddtree.reference.export import DTYPES, deepseek_config, draft_config, int4_quantization_config
    from ddtree.reference.hf_tokenizer import write_hf_tokenizer

    cfg = pair.target.config
    check(cfg, big)
    big_cfg = enlarged_target_config(cfg, big)
    dtype_name = next(k for k, v in DTYPES.items() if v == dtype)
    config = deepseek_config(big_cfg, dtype_name)
    if int4:
        config["quantization_config"] = int4_quantization_config()
    target, weight_map = Path(out) / "target", {}
    target.mkdir(parents=True, exist_ok=True)

    def shard(file: str, tensors: dict[str, torch.Tensor]) -> None:
        data = {sglang_name(k): (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
        save_file(data, str(target / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in data})

    shard("model-globals.safetensors", global_target_tensors(pair, big))
    for i, tensors in enlarged_target_layers(pair, big, Int4Experts() if int4 else FloatExperts()):
        shard(f"model-{i:03d}.safetensors", tensors)
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                     indent=1, sort_keys=True) + "\n")
    (target / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    write_hf_tokenizer(pair.tokenizer, target, cfg.max_position_embeddings)
    draft = Path(out) / "draft"
    draft.mkdir(parents=True, exist_ok=True)
    dcfg = enlarged_draft_config(pair.draft.config, cfg, big)
    (draft / "config.json").write_text(json.dumps(draft_config(dcfg, big_cfg, dtype_name), indent=1, sort_keys=True) + "\n")
    save_file({k: v.to(dtype).contiguous() for k, v in enlarged_draft_tensors(pair, big).items()},
              str(draft / "model.safetensors"), metadata={"format": "pt"})
    return config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree.reference.enlarge", description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, help="a trained Kimi-shaped reference pair (target/ and draft/)")
    ap.add_argument("--out", required=True, help="where the enlarged pair goes, in SGLang's formats")
    ap.add_argument("--extra-layers", type=int, default=Enlargement.extra_layers)
    ap.add_argument("--int4-experts", action="store_true", help="routed experts in Kimi K2.6's INT4 (Marlin on GPUs)")
    args = ap.parse_args(argv)
    pair = load_pair(args.pair)
    big = Enlargement(extra_layers=args.extra_layers)
    try:
        config = write_enlarged(pair, Path(args.out), big, args.int4_experts)
    except ValueError as err:
        print(f"enlarge: {err}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*.safetensors")) / 1e9
    print(f"enlarged {args.pair} to {args.out}: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
          f"{config['n_routed_experts']} experts{' (INT4)' if args.int4_experts else ''}, {size:.1f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
