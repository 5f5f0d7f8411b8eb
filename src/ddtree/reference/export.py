"""python -m ddtree.reference.export --pair DIR --out DIR [--dtype bfloat16]

Writes a reference pair (DIR/target + DIR/draft, as bench/train_pair.py or ddtree.reference.init
write them) in the checkpoint formats SGLang 0.5.23 loads, with no code of SGLang's:
  OUT/target  Qwen3ForCausalLM: config.json (model_type qwen3) + model.safetensors with the
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


def target_config(cfg: TargetConfig, dtype: str) -> dict:
    return {**_common(cfg, dtype, cfg.vocab_size), "architectures": ["Qwen3ForCausalLM"],
            "num_hidden_layers": cfg.num_hidden_layers, "max_position_embeddings": cfg.max_position_embeddings,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


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


def target_tensors(pair: Pair) -> dict[str, torch.Tensor]:
    t = pair.target
    out = {"model.embed_tokens.weight": t.embed_tokens.weight, "model.norm.weight": t.norm.weight,
           "lm_head.weight": t.lm_head.weight}
    for i, layer in enumerate(t.layers):
        out.update(_block_tensors(f"model.layers.{i}.", layer))
    return out


def draft_tensors(pair: Pair) -> dict[str, torch.Tensor]:
    d = pair.draft
    out = {"fc.weight": d.fc.weight, "hidden_norm.weight": d.hidden_norm.weight, "norm.weight": d.norm.weight}
    for i, layer in enumerate(d.layers):
        out.update(_block_tensors(f"layers.{i}.", layer))
    return out


def _write(directory: Path, config: dict, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    data = {k: v.detach().to(device="cpu", dtype=dtype).contiguous() for k, v in tensors.items()}
    save_file(data, str(directory / "model.safetensors"), metadata={"format": "pt"})


def export_pair(pair: Pair, out: Path, dtype: str = "bfloat16") -> None:
    out = Path(out)
    draft_cfg = draft_config(pair.draft.config, pair.target.config, dtype)   # checks before writing anything
    _write(out / "target", target_config(pair.target.config, dtype), target_tensors(pair), DTYPES[dtype])
    _write(out / "draft", draft_cfg, draft_tensors(pair), DTYPES[dtype])
    write_hf_tokenizer(pair.tokenizer, out / "target", pair.target.config.max_position_embeddings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree.reference.export", description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, help="reference pair directory (target/ and draft/ inside)")
    ap.add_argument("--out", required=True, help="output directory (target/ and draft/ in SGLang's formats)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    args = ap.parse_args(argv)
    export_pair(load_pair(args.pair), Path(args.out), args.dtype)
    print(f"exported {args.pair} to {args.out} (Qwen3ForCausalLM + DFlashDraftModel, {args.dtype}; byte tokenizer.json "
          "with a chat template)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
