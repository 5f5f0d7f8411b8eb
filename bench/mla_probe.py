"""A first look at DDTREE on a DeepSeek-V3-shaped target (MLA, MoE with a shared expert and
sigmoid / no-aux routing, YaRN rope) inside SGLang 0.5.23 on the GPU test bed: random weights
(`--load-format dummy`), so only "does it start, capture its graphs and decode, and what does it
emit next to NONE" - no acceptance, no speed (issue 31 trains a Kimi-shaped pair).

    python3 -m bench.mla_probe --out DIR [--timeout 330]

Writes DIR/pair/{target,draft}/config.json, starts NONE, DFLASH and DDTREE b32 c8 (CUDA graphs on)
together, sends greedy requests and prints a table: healthy after, errors, tokens equal to NONE.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

from testbed import servers as harness

# The DeepSeek-V3 text model of Kimi K2.6 (MLA, 1 dense layer then MoE, sigmoid scoring with a
# correction bias, no-aux top-k, one shared expert, YaRN), every width scaled down.
TARGET = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 192, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 2.827,
    "rope_theta": 50000.0, "max_position_embeddings": 4096,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}
# A DFlash draft of the target's width reading target layers 0 and 2 (below the last), block 8.
DRAFT = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "torch_dtype": "bfloat16",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "max_position_embeddings": 4096, "hidden_act": "silu", "attention_bias": False,
    "tie_word_embeddings": False, "block_size": 8, "num_target_layers": 4,
    "dflash_config": {"block_size": 8, "target_layer_ids": [0, 2], "mask_token_id": 1000},
}
DUMMY = ("--load-format", "dummy")
CONFIGS = [replace(harness.NONE, extra=DUMMY),
           replace(harness.DFLASH, extra=DUMMY + ("--speculative-draft-load-format", "dummy")),
           replace(harness.ddtree(32, 8), extra=DUMMY + ("--speculative-draft-load-format", "dummy"))]


def write_pair(root: Path) -> Path:
    for name, cfg in (("target", TARGET), ("draft", DRAFT)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=330)
    ap.add_argument("--prompts", type=int, default=8)
    args = ap.parse_args(argv)
    pair = write_pair(args.out / "pair")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(8, 48))] for _ in range(args.prompts)]
    servers = {c.name: harness.Server(c, 31300 + i, args.out / "logs" / f"{c.name}.log") for i, c in enumerate(CONFIGS)}
    for s in servers.values():
        s.start(pair)
    outputs = {}

    def ask(name: str, s: harness.Server, row: dict) -> None:
        answers = s.complete_all(prompts, harness.greedy(64), 4)
        outputs[name] = [a["output_ids"] for a in answers]
        row["accept_length"] = answers[0]["meta_info"].get("spec_accept_length")

    rows = harness.probe_servers(servers, args.timeout, ask)
    base = outputs.get("none")
    for row in rows:
        got = outputs.get(row["server"])
        if base and got:
            row["equal_to_none"] = f"{sum(a == b for a, b in zip(base, got))}/{len(base)}"
            row["first_divergences"] = [harness.first_divergence(a, b) for a, b in zip(base, got)]
    print("| server | healthy after (s) | accept length (1st request) | equal to NONE | first divergence per prompt | errors |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['healthy_after_s']} | {r.get('accept_length')} | {r.get('equal_to_none')} | "
              f"{r.get('first_divergences')} | {' / '.join(r['errors'])[:600]} |")
    (args.out / "mla_probe.json").write_text(json.dumps({"target": TARGET, "draft": DRAFT, "rows": rows}, indent=1))
    return 0 if all(r["healthy_after_s"] is not None and not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
