"""Kimi K2.6's own classes through DDTREE on the GPU test bed, before any training (issue 31, step 0):
does SGLang 0.5.23 load the KimiK25ForConditionalGeneration wrapper (vision tower + DeepSeek-V3
language model) at Kimi's latent widths, do DDTREE's tree-masked verify and its graphs run on its MLA
path, does it equal NONE token for token, and do the radix cache (Python tree core), FlashInfer's MLA
backend and INT4 routed experts (compressed-tensors W4A16, pack-quantized, group 32, as Kimi ships
them) start and decode. Random weights (`--load-format dummy`): deterministic logits, no acceptance.

    python3 -m bench.kimi_probe --out DIR --group wrapper|int4|overlap|all [--timeout 420]

The target's config is Kimi-K2.5's public config.json (moonshotai/Kimi-K2.5, read through the search
tool on 2026-12-02; SGLang 0.5.23 loads K2.6 with the same KimiK25 classes) with every width scaled
down except the MLA latent widths (kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128: SGLang's Triton MLA decode kernel is built for 512 + 64), the vocabulary (163,840) and
the special ids; the draft keeps z-lab's Kimi DFlash layout in proportion (8 : 1 query to KV heads,
six target layer ids below the last layer, block 8, mask token 163838, YaRN).
Writes DIR/<pair>/{target,draft}/config.json and DIR/kimi_probe.json; prints one table.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from testbed import servers as harness

from ddtree.reference.export import int4_quantization_config

VOCAB, MASK_TOKEN, BOS, EOS, PAD, MEDIA = 163840, 163838, 163584, 163585, 163839, 163605
YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0}
# Kimi K2.5/K2.6's text model (DeepSeek-V3: MLA, 1 dense layer then MoE with one shared expert,
# sigmoid scoring + correction bias, noaux_tc top-k), 8 layers, widths scaled down
TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "torch_dtype": "bfloat16",
    "vocab_size": VOCAB, "hidden_size": 512, "intermediate_size": 1280, "moe_intermediate_size": 256,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 384, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 2.827, "num_nextn_predict_layers": 0,
    "rope_theta": 50000.0, "max_position_embeddings": 262144, "rope_scaling": YARN,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
}
# the vision tower as small as the classes take (no image is sent); SGLang's KimiK25VisionConfig
# reads hidden_size / num_hidden_layers / ..., the projector vt_hidden_size: both spellings given
VISION = {"patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8, "init_pos_emb_time": 4,
          "pos_emb_type": "divided_fixed", "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 64,
          "intermediate_size": 128, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1, "vt_hidden_size": 64,
          "vt_intermediate_size": 128, "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
          "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger", "mm_hidden_size": 64,
          "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5, "text_hidden_size": 512}
WRAPPER = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "torch_dtype": "bfloat16",
           "text_config": TEXT, "vision_config": VISION, "media_placeholder_token_id": MEDIA, "pad_token_id": PAD,
           "bos_token_id": BOS, "eos_token_id": EOS, "use_unified_vision_chunk": True, "tie_word_embeddings": False}
# the routed experts' format of the published checkpoint (its quantization_config, verbatim in meaning): the export's
INT4 = int4_quantization_config()
# z-lab's Kimi K2.x DFlash draft in proportion: 64 : 8 query : KV heads, six target layers spread
# below the last one (SGLang captures "before layer id + 1"), block 8, the mask token near the top
DRAFT = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "torch_dtype": "bfloat16",
    "vocab_size": VOCAB, "hidden_size": 512, "intermediate_size": 1280, "num_attention_heads": 8,
    "num_key_value_heads": 1, "head_dim": 64, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0, "max_position_embeddings": 262144, "rope_scaling": YARN, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "block_size": 8, "num_target_layers": 8,
    "dflash_config": {"block_size": 8, "target_layer_ids": [0, 1, 2, 3, 5, 6], "mask_token_id": MASK_TOKEN},
}


def target_config(kind: str, arch: str = "wrapper") -> dict:
    """wrapper: the target; int4: the same with INT4 routed experts; dsv3: the text model alone.
    arch wrapper: KimiK25ForConditionalGeneration; arch dsv3: DeepseekV3ForCausalLM for all three
    (the fallback the issue names)."""
    if kind == "dsv3" or arch == "dsv3":
        cfg = {**copy.deepcopy(TEXT), "model_type": "deepseek_v3"}
        if kind == "int4":
            cfg["quantization_config"] = copy.deepcopy(INT4)
        return cfg
    cfg = copy.deepcopy(WRAPPER)
    if kind == "int4":
        cfg["text_config"]["quantization_config"] = copy.deepcopy(INT4)
    return cfg


def write_pair(root: Path, kind: str, arch: str = "wrapper") -> Path:
    for name, cfg in (("target", target_config(kind, arch)), ("draft", DRAFT)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return root


DUMMY = ("--load-format", "dummy")
# the wrapper's HTTP side loads Kimi's image processor (remote code shipped with the checkpoint,
# absent here) unless the server is language-model-only; the model itself keeps its vision tower
LM_ONLY = ("--language-model-only",)
DRAFT_DUMMY = DUMMY + ("--speculative-draft-load-format", "dummy")
PYTHON_RADIX = (("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python"),)


@dataclass(frozen=True)
class Probe:
    """One server of the probe: its configuration, the pair it loads, and the server whose tokens it
    must equal (None: it is a reference)."""
    config: harness.ServerConfig
    pair: str
    reference: str | None = None


def probes(group: str, arch: str = "wrapper") -> list[Probe]:
    lm_only = LM_ONLY if arch == "wrapper" else ()
    b32 = harness.ddtree(32, 8)
    radix = {"radix": True, "env": PYTHON_RADIX}
    wrapper = [
        Probe(replace(harness.NONE, extra=DUMMY + lm_only), "wrapper"),
        Probe(replace(b32, extra=DRAFT_DUMMY + lm_only), "wrapper", "none"),
        Probe(replace(harness.ddtree(8, 4, graphs=False), extra=DRAFT_DUMMY + lm_only), "wrapper", "none"),
        Probe(replace(harness.DFLASH, extra=DRAFT_DUMMY + lm_only), "wrapper", "none"),
        Probe(replace(b32, name="ddtree-b32-c8-flashinfer", extra=DRAFT_DUMMY + lm_only + ("--attention-backend", "flashinfer")),
              "wrapper", "none"),
        Probe(replace(harness.NONE, name="none-radix", extra=DUMMY + lm_only, **radix), "wrapper", "none"),
        Probe(replace(b32, name="ddtree-b32-c8-radix", extra=DRAFT_DUMMY + lm_only, **radix), "wrapper", "none"),
    ]
    int4 = [
        Probe(replace(harness.NONE, name="none-int4", extra=DUMMY + lm_only), "int4"),
        Probe(replace(b32, name="ddtree-b32-c8-int4", extra=DRAFT_DUMMY + lm_only), "int4", "none-int4"),
        Probe(replace(harness.NONE, name="none-dsv3", extra=DUMMY), "dsv3"),
        Probe(replace(b32, name="ddtree-b32-c8-dsv3", extra=DRAFT_DUMMY), "dsv3", "none-dsv3"),
    ]
    # overlap: DDTREE and DFLASH under SGLang's overlap scheduler (issue 35), DDTREE with torch's sync debug mode
    overlap = [
        int4[2],
        Probe(replace(harness.config("ddtree-b32-c8-graphs-overlap-synccheck"), name="ddtree-b32-c8-overlap-dsv3",
                      extra=DRAFT_DUMMY), "dsv3", "none-dsv3"),
        Probe(replace(harness.DFLASH, name="dflash-overlap-dsv3", overlap=True, extra=DRAFT_DUMMY), "dsv3", "none-dsv3"),
    ]
    # marlin-warm: one INT4 server whose first start JIT-compiles SGLang's Marlin MoE kernel into ~/.cache/sglang/jit
    return {"wrapper": wrapper, "int4": int4, "int4-only": int4[:2], "marlin-warm": int4[:1], "overlap": overlap,
            "all": wrapper + int4}[group]


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 160000) for _ in range(rng.randrange(8, 48))] for _ in range(n)]


def radix_prompts(base: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
    """Prompts the radix cache serves from a prefix: a shared 64-token system prompt before each
    prompt, and an earlier prompt followed by its own answer (a chat's next turn)."""
    system = prompts(1, seed=7)[0] * 3
    return [system + p for p in base[:4]] + [p + a for p, a in zip(base[:4], answers[:4])]


def run(args) -> list[dict]:
    root = args.out
    for kind in ("wrapper", "int4", "dsv3"):
        write_pair(root / kind, kind, args.arch)
    chosen = {p.config.name: p for p in probes(args.group, args.arch)}
    servers = {name: harness.Server(p.config, 31400 + i, root / "logs" / f"{name}.log")
               for i, (name, p) in enumerate(chosen.items())}
    for name, s in servers.items():
        s.start(root / chosen[name].pair)
    greedy = harness.greedy(48)
    base = prompts(args.prompts)
    outputs = {}

    def ask(name: str, s: harness.Server, row: dict) -> None:
        row.update(pair=chosen[name].pair, radix=s.config.radix)
        answers = s.complete_all(base, greedy, 4)
        bad = [a for a in answers if "output_ids" not in a]
        if bad:
            raise RuntimeError(str(bad[0])[:300])
        outputs[name] = [a["output_ids"] for a in answers]
        row["accept_length"] = answers[0]["meta_info"].get("spec_accept_length")
        if s.config.radix or name == "none":
            again = s.complete_all(radix_prompts(base, outputs[name]), greedy, 4)
            outputs[name + "/radix-prompts"] = [a["output_ids"] for a in again]
            row["cached_tokens"] = [a["meta_info"].get("cached_tokens") for a in again]

    rows = harness.probe_servers(servers, args.timeout, ask)
    for row in rows:
        row.setdefault("pair", chosen[row["server"]].pair)
        row.setdefault("radix", chosen[row["server"]].config.radix)
    for row in rows:
        ref = chosen[row["server"]].reference
        got, want = outputs.get(row["server"]), outputs.get(ref) if ref else None
        if got and want:
            row["equal_to_" + ref] = f"{sum(a == b for a, b in zip(want, got))}/{len(want)}"
            row["first_divergences"] = [harness.first_divergence(a, b) for a, b in zip(want, got)]
        if row["radix"] and outputs.get(row["server"] + "/radix-prompts") and outputs.get("none/radix-prompts"):
            mine, plain = outputs[row["server"] + "/radix-prompts"], outputs["none/radix-prompts"]
            row["radix_prompts_equal_to_none_without_cache"] = f"{sum(a == b for a, b in zip(plain, mine))}/{len(plain)}"
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--group", choices=("wrapper", "int4", "int4-only", "marlin-warm", "overlap", "all"), default="wrapper")
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--arch", choices=("wrapper", "dsv3"), default="wrapper",
                    help="dsv3: every pair as DeepseekV3ForCausalLM (the text model alone)")
    ap.add_argument("--prompts", type=int, default=8)
    args = ap.parse_args(argv)
    rows = run(args)
    print("| server | pair | radix | healthy after (s) | accept length | equal to its reference | first divergence "
          "per prompt | cached tokens (radix prompts) | radix prompts = NONE without cache | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        equal = next((f"{k[9:]}: {v}" for k, v in r.items() if k.startswith("equal_to_")), "")
        print(f"| {r['server']} | {r['pair']} | {r['radix']} | {r['healthy_after_s']} | {r.get('accept_length')} | "
              f"{equal} | {r.get('first_divergences', '')} | {r.get('cached_tokens', '')} | "
              f"{r.get('radix_prompts_equal_to_none_without_cache', '')} | {' / '.join(r['errors'])[:500]} |")
    (args.out / "kimi_probe.json").write_text(json.dumps({"configs": {k: target_config(k, args.arch) for k in ("wrapper", "int4", "dsv3")},
                                                          "draft": DRAFT, "rows": rows}, indent=1))
    return 0 if all(r["healthy_after_s"] is not None and not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
