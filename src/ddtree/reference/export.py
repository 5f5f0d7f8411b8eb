"""python -m ddtree.reference.export --pair DIR --out DIR [--dtype bfloat16]

Writes a reference pair (DIR/target + DIR/draft, as training/train_pair.py or ddtree.reference.init
write them) in the checkpoint formats SGLang 0.5.23 loads, with no code of SGLang's:
  OUT/target  an MLA target (Kimi K2.6's text model, ddtree.reference.mla): DeepseekV3ForCausalLM, or
              with --kimi-wrapper KimiK25ForConditionalGeneration (the same tensors under language_model.);
              a Qwen3-style one: Qwen3ForCausalLM: config.json (model_type qwen3) + model.safetensors with the
              Hugging Face names (model.embed_tokens, model.layers.i.self_attn.{q,k,v,o}_proj,
              .{q,k}_norm, .input_layernorm, .post_attention_layernorm, .mlp.{gate,up,down}_proj,
              model.norm, lm_head);
  OUT/draft   DFlashDraftModel: config.json with dflash_config {block_size, target_layer_ids,
              mask_token_id} + model.safetensors (layers.i.*, fc, hidden_norm, norm); embeddings
              and LM head are the target's, as in SGLang.
OUT/target also gets the byte tokenizer as a Hugging Face fast tokenizer with a chat template
(ddtree.reference.hf_tokenizer), so `sglang serve` answers text, chat and completions requests as
it does in production; --skip-tokenizer-init (requests send input_ids) works as before.
The architectures are the same maths: pre-norm Qwen3 blocks with per-head q/k RMSNorm and
rotate-half RoPE; a DFlash draft whose context K/V come from fc + hidden_norm over
the concatenated outputs of target_layer_ids (SGLang captures layer k's output as the input of
layer k + 1, so the ids must stay below the target's last layer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ddtree.reference.config import DraftConfig, TargetConfig
from ddtree.reference.hf_tokenizer import write_hf_tokenizer
from ddtree.reference.pair import Pair, load_pair

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _common(cfg, dtype: str, vocab_size: int) -> dict:
    return {"model_type": "qwen3", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "vocab_size": vocab_size, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta, "hidden_act": "silu", "attention_bias": False,
            "tie_word_embeddings": False, "torch_dtype": dtype}


def target_config(cfg: TargetConfig, dtype: str, wrapper: bool = False) -> dict:
    if cfg.is_mla:
        return kimi_config(cfg, dtype) if wrapper else deepseek_config(cfg, dtype)
    return {**_common(cfg, dtype, cfg.vocab_size), "architectures": ["Qwen3ForCausalLM"],
            "num_hidden_layers": cfg.num_hidden_layers, "max_position_embeddings": cfg.max_position_embeddings,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


def deepseek_config(cfg: TargetConfig, dtype: str) -> dict:
    """DeepseekV3ForCausalLM's config.json (Kimi K2.6's text model): MLA, the noaux_tc MoE, YaRN."""
    out = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": dtype,
           "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
           "num_key_value_heads": cfg.num_attention_heads, "max_position_embeddings": cfg.max_position_embeddings,
           "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "hidden_act": "silu",
           "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": cfg.bos_token_id,
           "eos_token_id": cfg.eos_token_id, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
           "moe_layer_freq": 1, "num_nextn_predict_layers": 0}
    for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                 "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size",
                 "first_k_dense_replace", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor"):
        out[name] = getattr(cfg, name)
    if cfg.rope_scaling:
        out["rope_scaling"] = dict(cfg.rope_scaling)
    return out


# the vision tower as small as SGLang 0.5.23's KimiK25 classes take (no image is sent to the test pair);
# its weights are left out of the checkpoint (SGLang loads the language model's and leaves these)
KIMI_VISION = {"patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8, "init_pos_emb_time": 4,
               "pos_emb_type": "divided_fixed", "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 64,
               "intermediate_size": 128, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1, "vt_hidden_size": 64,
               "vt_intermediate_size": 128, "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
               "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger", "mm_hidden_size": 64,
               "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5}


def kimi_config(cfg: TargetConfig, dtype: str) -> dict:
    """KimiK25ForConditionalGeneration's config.json: the DeepSeek-V3 text model (model_type kimi_k2,
    as Kimi-K2.5's published config) inside the vision wrapper."""
    text = {**deepseek_config(cfg, dtype), "model_type": "kimi_k2"}
    # the byte vocabulary has no media token: the pad id stands for Kimi's <|media_pad|> (no image is sent)
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "torch_dtype": dtype,
            "text_config": text, "vision_config": {**KIMI_VISION, "text_hidden_size": cfg.hidden_size},
            "media_placeholder_token_id": cfg.vocab_size - 1, "pad_token_id": cfg.vocab_size - 1,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "tie_word_embeddings": False}


# the media settings SGLang 0.5.23's Kimi processor reads (Kimi K2.x's values: 14-pixel patches merged 2 x 2)
KIMI_MEDIA = {"patch_size": 14, "merge_kernel_size": [2, 2], "in_patch_limit": 16384, "patch_limit_on_one_side": 512,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
STAND_IN = "kimi_text_processor"


def write_kimi_text_processor(directory: Path) -> None:
    """The wrapper's processor as remote code of this project's own (ddtree.reference.kimi_text_processor):
    SGLang builds Kimi's multimodal processor at start-up, and the real one ships with Kimi's checkpoint."""
    source = Path(__file__).with_name(f"{STAND_IN}.py").read_text()
    (directory / f"{STAND_IN}.py").write_text(source)
    config = {"auto_map": {"AutoProcessor": f"{STAND_IN}.KimiTextOnlyProcessor"}, "media_proc_cfg": KIMI_MEDIA}
    (directory / "processor_config.json").write_text(json.dumps(config, indent=1) + "\n")


# Kimi K2.6's routed experts as it ships them: compressed-tensors W4A16, pack-quantized, symmetric INT4 in
# groups of 32 along the input; everything else (attention, shared experts, dense MLPs, LM head) in bf16
INT4_GROUP = 32
INT4_IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"]


def int4_quantization_config() -> dict:
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP,
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "kv_cache_scheme": None, "ignore": list(INT4_IGNORE),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None}}}


def int4_pack(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """One expert projection [out, in] as compressed-tensors stores it (its own quantize and pack):
    weight_packed int32 [out, in / 8], weight_scale [out, in / 32], weight_shape [2]."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = QuantizationArgs(**int4_quantization_config()["config_groups"]["group_0"]["weights"])
    w = weight.detach().float().cpu()
    out_features, in_features = w.shape
    if in_features % INT4_GROUP:
        raise ValueError(f"an expert's input width {in_features} is not a multiple of the INT4 group {INT4_GROUP}")
    groups = w.view(out_features, in_features // INT4_GROUP, INT4_GROUP)
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)           # [out, in / 32]
    q = quantize(w, scale, zero, args, dtype=torch.int8)                              # [out, in] int8 in -8..7
    return {"weight_packed": pack_to_int32(q, 4), "weight_scale": scale,
            "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int32)}


def int4_roundtrip(weight: torch.Tensor, scale_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The weight an INT4 export serves: int4_pack, unpacked with compressed-tensors' own unpacking, times
    its scales as stored (in scale_dtype); float32 [out, in]."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    packed = int4_pack(weight)
    q = unpack_from_int32(packed["weight_packed"], 4, torch.Size(weight.shape)).float()
    scale = packed["weight_scale"].to(scale_dtype).float().repeat_interleave(INT4_GROUP, dim=1)
    return q * scale


def int4_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The routed experts' projections replaced by their INT4 form; every other tensor kept."""
    out = {}
    for name, tensor in tensors.items():
        if ".mlp.experts." in name and name.endswith("_proj.weight"):
            stem = name[: -len("weight")]
            out.update({stem + key: value for key, value in int4_pack(tensor).items()})
        else:
            out[name] = tensor
    return out


def draft_config(cfg: DraftConfig, target: TargetConfig, dtype: str) -> dict:
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.num_hidden_layers - 1]
    if bad:
        raise ValueError(f"draft target_layer_ids {bad} cannot be captured by SGLang: expected ids below "
                         f"{target.num_hidden_layers - 1} (the target's last layer); train a draft on earlier layers")
    return {**_common(cfg, dtype, target.vocab_size), "architectures": ["DFlashDraftModel"],
            "num_hidden_layers": cfg.num_hidden_layers, "max_position_embeddings": target.max_position_embeddings,
            "block_size": cfg.block_size, "num_target_layers": target.num_hidden_layers,
            "dflash_config": {"block_size": cfg.block_size, "target_layer_ids": list(cfg.target_layer_ids),
                              "mask_token_id": cfg.mask_token_id}}


def _block_tensors(prefix: str, layer) -> dict[str, torch.Tensor]:
    attn, mlp = layer.self_attn, layer.mlp
    named = {"input_layernorm.weight": layer.input_layernorm.weight,
             "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
             "self_attn.q_proj.weight": attn.q_proj.weight, "self_attn.k_proj.weight": attn.k_proj.weight,
             "self_attn.v_proj.weight": attn.v_proj.weight, "self_attn.o_proj.weight": attn.o_proj.weight,
             "self_attn.q_norm.weight": attn.q_norm.weight, "self_attn.k_norm.weight": attn.k_norm.weight,
             "mlp.gate_proj.weight": mlp.gate_proj.weight, "mlp.up_proj.weight": mlp.up_proj.weight,
             "mlp.down_proj.weight": mlp.down_proj.weight}
    return {f"{prefix}{name}": t for name, t in named.items()}


def _mla_block_tensors(prefix: str, layer) -> dict[str, torch.Tensor]:
    """A DeepSeek-V3 layer under its checkpoint names: MLA, then a dense MLP or the MoE (router,
    correction bias, each routed expert, the shared expert)."""
    attn, mlp = layer.self_attn, layer.mlp
    named = {"input_layernorm.weight": layer.input_layernorm.weight,
             "post_attention_layernorm.weight": layer.post_attention_layernorm.weight}
    for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
        named[f"self_attn.{name}.weight"] = getattr(attn, name).weight
    mlps = {"mlp": mlp} if not hasattr(mlp, "experts") else {
        **{f"mlp.experts.{e}": expert for e, expert in enumerate(mlp.experts)}, "mlp.shared_experts": mlp.shared_experts}
    for where, block in mlps.items():
        for name in ("gate_proj", "up_proj", "down_proj"):
            named[f"{where}.{name}.weight"] = getattr(block, name).weight
    if hasattr(mlp, "gate"):
        named["mlp.gate.weight"] = mlp.gate.weight
        named["mlp.gate.e_score_correction_bias"] = mlp.gate.e_score_correction_bias
    return {f"{prefix}{name}": t for name, t in named.items()}


def target_tensors(pair: Pair, wrapper: bool = False) -> dict[str, torch.Tensor]:
    """The target's checkpoint tensors; an MLA target's under DeepseekV3ForCausalLM's names, prefixed
    `language_model.` inside the Kimi wrapper (which strips it before the language model loads them)."""
    t = pair.target
    prefix = "language_model." if wrapper and t.config.is_mla else ""
    block = _mla_block_tensors if t.config.is_mla else _block_tensors
    out = {"model.embed_tokens.weight": t.embed_tokens.weight, "model.norm.weight": t.norm.weight,
           "lm_head.weight": t.lm_head.weight}
    for i, layer in enumerate(t.layers):
        out.update(block(f"model.layers.{i}.", layer))
    return {prefix + name: tensor for name, tensor in out.items()}


def draft_tensors(pair: Pair) -> dict[str, torch.Tensor]:
    d = pair.draft
    out = {"fc.weight": d.fc.weight, "hidden_norm.weight": d.hidden_norm.weight, "norm.weight": d.norm.weight}
    for i, layer in enumerate(d.layers):
        out.update(_block_tensors(f"layers.{i}.", layer))
    return out


def _write(directory: Path, config: dict, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Floating tensors in `dtype`; integer ones (INT4 packs and shapes) as they are."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    data = {k: v.detach().to(device="cpu", dtype=dtype if v.is_floating_point() else v.dtype).contiguous()
            for k, v in tensors.items()}
    save_file(data, str(directory / "model.safetensors"), metadata={"format": "pt"})


def export_pair(pair: Pair, out: Path, dtype: str = "bfloat16", wrapper: bool = False, int4: bool = False) -> None:
    """wrapper: an MLA target as KimiK25ForConditionalGeneration (else DeepseekV3ForCausalLM), with the
    text-only stand-in of Kimi's processor; int4: its routed experts in Kimi K2.6's INT4 format."""
    out = Path(out)
    if int4 and not (pair.target.config.is_mla and pair.target.config.n_routed_experts):
        raise ValueError("--int4-experts needs a target with routed experts (an MLA + MoE target, e.g. "
                         "training/train_pair.py --size kimi)")
    draft_cfg = draft_config(pair.draft.config, pair.target.config, dtype)   # checks before writing anything
    config, tensors = target_config(pair.target.config, dtype, wrapper), target_tensors(pair, wrapper)
    if int4:
        tensors = int4_experts(tensors)
        (config["text_config"] if wrapper else config)["quantization_config"] = int4_quantization_config()
    _write(out / "target", config, tensors, DTYPES[dtype])
    _write(out / "draft", draft_cfg, draft_tensors(pair), DTYPES[dtype])
    write_hf_tokenizer(pair.tokenizer, out / "target", pair.target.config.max_position_embeddings)
    if wrapper and pair.target.config.is_mla:
        write_kimi_text_processor(out / "target")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree.reference.export", description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, help="reference pair directory (target/ and draft/ inside)")
    ap.add_argument("--out", required=True, help="output directory (target/ and draft/ in SGLang's formats)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--kimi-wrapper", action="store_true",
                    help="an MLA target as KimiK25ForConditionalGeneration (default: DeepseekV3ForCausalLM)")
    ap.add_argument("--int4-experts", action="store_true",
                    help="an MLA + MoE target's routed experts as Kimi K2.6 ships them (compressed-tensors W4A16, "
                         "pack-quantized, group 32; needs the compressed-tensors package)")
    args = ap.parse_args(argv)
    pair = load_pair(args.pair)
    try:
        export_pair(pair, Path(args.out), args.dtype, args.kimi_wrapper, args.int4_experts)
    except ValueError as err:
        print(f"export: {err}", file=sys.stderr)
        return 2
    arch = target_config(pair.target.config, args.dtype, args.kimi_wrapper)["architectures"][0]
    print(f"exported {args.pair} to {args.out} ({arch}{', INT4 routed experts' if args.int4_experts else ''} + "
          f"DFlashDraftModel, {args.dtype}; byte tokenizer.json with a chat template)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
