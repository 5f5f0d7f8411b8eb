"""Issue 69's timing rig: what one TP-8 rank of Kimi K2.6 pays for a forward of T tokens, on the GPU test bed.

One rank's slice of Kimi K2.6's text model (DeepSeek-V3 layout at the widths one of 8 tensor-parallel ranks
holds: hidden 7168; MLA with 8 of 64 heads, q_lora 1536, kv_lora 512; 384 routed experts of width 256 (2048 / 8)
plus one shared, top 8; layer 0 dense of width 2304 (18432 / 8); vocabulary 20,480 (163,840 / 8)), LAYERS layers
(default 40: 47 GB of weights, what an H100 holds beside the graphs), routed experts in INT4 as Kimi ships them
(compressed-tensors W4A16, group 32) under SGLang's Marlin kernels, random weights (`--load-format dummy`) and
SGLang's own routing simulation (a router on random weights sends nearly every token to the same experts):

    uniform      SGLANG_SIMULATE_UNIFORM_EXPERTS=1: each token a random base expert and its seven partners
                 spaced 384 / 8 apart (E x (1 - (1 - 8/384)^T) distinct experts a layer in expectation)
    round-robin  SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS=1: token t's slots 8t .. 8t + 7 dealt in order
                 (min(384, 8 T) distinct: no two tokens share an expert until all are read - the steep end)

Three measurements, each with CUDA graphs, on the GPU machine after staging (`bench/kimi_rank.sh` runs them all):

    python3 -m bench.kimi_rank write   --out DIR [--layers 40]        the target's and the draft's config.json
    python3 -m bench.kimi_rank decode  --out DIR --routing uniform     SGLang's one-batch bench: a decode step of
                                                                       T requests = one forward of T tokens
    python3 -m bench.kimi_rank verify  --out DIR --routing uniform     DDTREE servers at each budget (width
                                                                       budget + 1) driven at each load with the
                                                                       worker's step profiler: the verify stage
                                                                       (the target-verify graph of batch x width)
    python3 -m bench.kimi_rank experts --out DIR                       distinct experts a layer reads at each T:
                                                                       SGLang's routing-simulation kernel itself;
                                                                       and the GPU's device-copy bandwidth
    python3 -m bench.kimi_rank report  --out DIR                       DIR/rig.json and the table (CPU)

The draft is z-lab's Kimi DFlash draft at one rank's widths (6 layers, 8 query / 1 KV heads of 128, MLP 2304,
block 8), random weights: it accepts nothing, which changes no forward's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed import servers

from ddtree.reference.export import int4_quantization_config
from ddtree.reference.hf_tokenizer import write_hf_tokenizer
from ddtree.reference.tokenizer import ByteTokenizer

TP = 8
EXPERTS, TOP_K, EXPERT_WIDTH = 384, 8, 2048 // TP
HIDDEN, VOCAB = 7168, 163840 // TP
ROUTING_ENV = {"uniform": "SGLANG_SIMULATE_UNIFORM_EXPERTS", "round-robin": "SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS"}
DECODE_TOKENS = (1, 8, 9, 16, 17, 33, 65, 129, 257, 513)     # one forward of T tokens (issue 69's list)
BUDGETS = (8, 16, 32, 64)                                     # verify widths 9, 17, 33, 65
LOADS = (1, 8, 16, 32, 48)                                    # running requests
INPUT_LEN = 128                                               # prompt tokens per request (KV read per step)
PROFILE_STEPS = 16                                            # decode steps per logged profile line
VERIFY_NEW_TOKENS = 56                                        # a request's decode steps (the draft accepts none)
RIG_PORT = 31600


def rank_target_config(layers: int) -> dict:
    """config.json of one TP-8 rank's slice of Kimi K2.6's text model (DeepseekV3ForCausalLM), INT4 experts."""
    if layers < 2:
        raise ValueError(f"--layers {layers} is too few: the rank's slice needs its dense layer 0 and at least one "
                         "MoE layer (Kimi K2.6 has 61: 1 dense + 60 MoE)")
    yarn = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
            "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 18432 // TP,
            "moe_intermediate_size": EXPERT_WIDTH, "num_hidden_layers": layers,
            "num_attention_heads": 64 // TP, "num_key_value_heads": 64 // TP,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "n_routed_experts": EXPERTS, "num_experts_per_tok": TOP_K, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.827,
            "num_nextn_predict_layers": 0, "rope_theta": 50000.0, "max_position_embeddings": 8192,
            "rope_scaling": yarn, "hidden_act": "silu", "rms_norm_eps": 1e-5, "attention_bias": False,
            "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 257,
            "quantization_config": int4_quantization_config()}


def draft_layer_ids(layers: int) -> list[int]:
    """Kimi's draft reads target layers [1, 12, 24, 35, 47, 58] of 61: the same spread over `layers`, each
    below the last layer (SGLang captures layer k's output as layer k + 1's input)."""
    kimi = (1, 12, 24, 35, 47, 58)
    return sorted({min(layers - 2, round(i * (layers - 1) / 60)) for i in kimi})


def rank_draft_config(layers: int) -> dict:
    """z-lab's Kimi DFlash draft at one rank's widths (64 : 8 query : KV heads of 128 split 8 ways, MLP 18432 / 8)."""
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "torch_dtype": "bfloat16",
            "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 18432 // TP,
            "num_attention_heads": 64 // TP, "num_key_value_heads": 1, "head_dim": 128, "num_hidden_layers": 6,
            "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 8192, "hidden_act": "silu",
            "attention_bias": False, "tie_word_embeddings": False, "block_size": 8, "num_target_layers": layers,
            "dflash_config": {"block_size": 8, "target_layer_ids": draft_layer_ids(layers), "mask_token_id": 258}}


def write_rig(out: Path, layers: int) -> Path:
    """DIR/rank/{target,draft}/config.json (+ the byte tokenizer SGLang's one-batch bench loads)."""
    pair = out / "rank"
    for name, cfg in (("target", rank_target_config(layers)), ("draft", rank_draft_config(layers))):
        (pair / name).mkdir(parents=True, exist_ok=True)
        (pair / name / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    write_hf_tokenizer(ByteTokenizer(), pair / "target", 8192)
    return pair


def routing_env(routing: str) -> dict[str, str]:
    if routing not in ROUTING_ENV:
        raise ValueError(f"--routing {routing!r} is invalid: expected one of {', '.join(ROUTING_ENV)}")
    return {ROUTING_ENV[routing]: "1"}


# --- one forward of T tokens: SGLang's one-batch bench ----------------------------------------------------------

def decode_command(pair: Path, tokens: tuple[int, ...], result: Path) -> list[str]:
    """SGLang's one-batch bench over the rank's slice. A static share of 0.65 leaves room for the bench's prefill of
    T x INPUT_LEN tokens at once (at T = 513 Marlin's intermediate cache alone asked 7 GiB past 0.85 on an H100)."""
    sizes = [str(t) for t in tokens]
    return [sys.executable, "-m", "sglang.benchmark.one_batch", "--model-path", str(pair / "target"),
            "--load-format", "dummy", "--attention-backend", "triton", "--disable-radix-cache",
            "--mem-fraction-static", "0.65", "--context-length", "1024", "--max-running-requests", str(max(tokens)),
            "--cuda-graph-bs-decode", *sizes, "--cuda-graph-max-bs-decode", str(max(tokens)),
            "--cuda-graph-backend-prefill", "disabled",
            "--batch-size", *sizes, "--input-len", str(INPUT_LEN), "--output-len", "24",
            "--result-filename", str(result)]


def run_decode(out: Path, routing: str, tokens: tuple[int, ...], timeout: float) -> Path:
    """SGLang's one-batch bench over `tokens` batch sizes; its result lines in DIR/decode-ROUTING.jsonl."""
    pair, result, log = out / "rank", out / f"decode-{routing}.jsonl", out / "logs" / f"decode-{routing}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    env = {**os.environ, **routing_env(routing)}
    with open(log, "w") as f:
        proc = subprocess.run(decode_command(pair, tokens, result), stdout=f, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout, check=False)
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"one-batch bench ({routing}) exited {proc.returncode}: see {log}")
    return result


def read_decode(result: Path) -> dict[int, float]:
    """T -> median decode step in ms, from the one-batch bench's result lines."""
    rows = {}
    for line in result.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[int(r["batch_size"])] = round(1000 * float(r["median_decode_latency"]), 3)
    return rows


# --- the verify path: DDTREE's target-verify graphs at batch x width ----------------------------------------------

def verify_config(budget: int, routing: str, loads: tuple[int, ...]) -> servers.ServerConfig:
    graph_sizes = tuple(str(b) for b in loads)
    return servers.ServerConfig(
        f"rig-b{budget}-{routing}", "DDTREE", budget, 8, True,
        extra=("--load-format", "dummy", "--speculative-draft-load-format", "dummy",
               "--cuda-graph-bs-decode", *graph_sizes),
        env=tuple(routing_env(routing).items()) + (("SGLANG_DDTREE_PROFILE_STEPS", str(PROFILE_STEPS)),),
        max_bs=max(loads), max_total_tokens=max(loads) * (INPUT_LEN + VERIFY_NEW_TOKENS + 2 * (budget + 16)))


@dataclass
class VerifyRow:
    budget: int
    width: int
    batch: int
    tokens: int                                   # batch x width through the target
    verify_ms: float                              # the verify stage, synchronised (graph replay + its inputs' copy)
    draft_ms: float
    step_ms: float
    steps: int
    routing: str


def drive(server: servers.Server, load: int, seed: int) -> None:
    """`load` requests at once, each INPUT_LEN prompt tokens and VERIFY_NEW_TOKENS decode steps."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 250) for _ in range(INPUT_LEN)] for _ in range(load)]
    answers = server.complete_all(prompts, servers.greedy(VERIFY_NEW_TOKENS), load)
    bad = [a for a in answers if "output_ids" not in a]
    if bad:
        raise RuntimeError(f"{server.config.name} at {load} requests: {str(bad[0])[:300]}")


def verify_rows(server: servers.Server, budget: int, routing: str, loads: tuple[int, ...]) -> list[VerifyRow]:
    from ddtree.sglang.diagnostics.profile import parse_profile_lines

    for i, load in enumerate(loads):
        drive(server, load, seed=i)
    last = {p.batch_size: p for p in parse_profile_lines(server.log_text())}
    rows = []
    for load in loads:
        p = last.get(load)
        if p is None:
            raise RuntimeError(f"{server.config.name}: no step profile line at batch {load} (see {server.log})")
        rows.append(VerifyRow(budget, budget + 1, load, load * (budget + 1), p.stages["verify"][1],
                              p.stages["draft"][1], p.stages["step"][1], p.steps, routing))
    return rows


def run_verify(out: Path, routing: str, budgets: tuple[int, ...], loads: tuple[int, ...],
               timeout: float) -> Path:
    """One DDTREE server per budget, one at a time (each holds the rank's weights), driven at every load."""
    rows: list[VerifyRow] = []
    errors: list[str] = []
    for i, budget in enumerate(budgets):
        cfg = verify_config(budget, routing, loads)
        server = servers.Server(cfg, RIG_PORT + 2 * i, out / "logs" / f"{cfg.name}.log")
        server.start(out / "rank")
        try:
            if not server.wait_ready(timeout):
                errors.append(f"{cfg.name} did not start: {server.exit_message()[-300:]}")
                continue
            print(f"[rig] {cfg.name} ready after {server.ready_after:.0f} s", flush=True)
            rows += verify_rows(server, budget, routing, loads)
        except RuntimeError as err:
            errors.append(str(err))
        finally:
            server.stop()
    path = out / f"verify-{routing}.json"
    path.write_text(json.dumps({"rows": [asdict(r) for r in rows], "errors": errors}, indent=1))
    return path


# --- distinct experts a layer reads ------------------------------------------------------------------------------

def distinct_experts(tokens: tuple[int, ...], layers: int) -> dict[str, dict[int, list[int]]]:
    """routing -> T -> distinct routed experts per layer, from SGLang's routing-simulation kernel itself (the one the
    forward runs; uniform: one seed a layer, as each layer's launch takes the next seed at graph capture)."""
    import torch
    from sglang.srt.layers.moe.topk import _simulate_balanced_routing

    out: dict[str, dict[int, list[int]]] = {"uniform": {}, "round-robin": {}}
    for t in tokens:
        for routing in out:
            counts = []
            for layer in range(1, layers):
                ids = torch.zeros((t, TOP_K), dtype=torch.int32, device="cuda")
                weights = torch.zeros((t, TOP_K), dtype=torch.float32, device="cuda")
                _simulate_balanced_routing(ids, weights, EXPERTS, random=routing == "uniform", layer_id=layer,
                                           seed=layer if routing == "uniform" else None)
                counts.append(int(torch.unique(ids).numel()))
            out[routing][t] = counts
    return out


# --- the GPU's memory bandwidth (the cost model's input) ----------------------------------------------------------

def copy_bandwidth(gib: float = 4.0, repeats: int = 20) -> float:
    """GB/s of a device-to-device copy of `gib` GiB (bytes read + written over the median time, CUDA events)."""
    import statistics

    import torch

    n = int(gib * 2**30) // 2
    src, dst = torch.ones(n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16, device="cuda")
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return round(2 * 2 * n / statistics.median(times[3:]) / 1e9, 1)


# --- the report ---------------------------------------------------------------------------------------------------

@dataclass
class Rig:
    layers: int
    gpu: str
    date: str
    decode_ms: dict[str, dict[int, float]] = field(default_factory=dict)     # routing -> T -> ms
    verify: list[dict] = field(default_factory=list)
    experts: dict[str, dict[int, float]] = field(default_factory=dict)       # routing -> T -> mean distinct a layer
    input_len: int = INPUT_LEN                                               # prompt tokens per request
    copy_gbps: float | None = None                                          # device copy bandwidth
    errors: list[str] = field(default_factory=list)


def gather(out: Path, layers: int, gpu: str, date: str) -> Rig:
    rig = Rig(layers, gpu, date)
    for routing in ROUTING_ENV:
        result = out / f"decode-{routing}.jsonl"
        if result.exists():
            rig.decode_ms[routing] = read_decode(result)
        verify = out / f"verify-{routing}.json"
        if verify.exists():
            data = json.loads(verify.read_text())
            rig.verify += data["rows"]
            rig.errors += data["errors"]
    experts = out / "experts.json"
    if experts.exists():
        data = json.loads(experts.read_text())
        rig.copy_gbps = data.pop("copy_gbps", None)
        for routing, by_t in data.items():
            rig.experts[routing] = {int(t): round(sum(c) / len(c), 1) for t, c in by_t.items()}
    return rig


def table(rig: Rig) -> str:
    tokens = sorted({t for by_t in rig.decode_ms.values() for t in by_t})
    lines = [f"one forward of T tokens (decode of T requests), {rig.layers} layers, {rig.gpu}, {rig.date}; "
             f"device copy {rig.copy_gbps} GB/s", "",
             "| routing | " + " | ".join(f"T={t}" for t in tokens) + " |", "|---|" + "---|" * len(tokens)]
    for routing, by_t in rig.decode_ms.items():
        lines.append(f"| {routing} ms | " + " | ".join(f"{by_t.get(t, '')}" for t in tokens) + " |")
        one = by_t.get(1)
        if one:
            lines.append(f"| {routing} x T=1 | " + " | ".join(f"{by_t[t] / one:.2f}" if t in by_t else ""
                                                            for t in tokens) + " |")
    for routing, by_t in rig.experts.items():
        lines.append(f"| {routing} experts a layer | " + " | ".join(f"{by_t.get(t, '')}" for t in tokens) + " |")
    if rig.verify:
        lines += ["", "DDTREE's verify stage (target-verify graph of batch x width, synchronised), ms:", "",
                  "| routing | budget (width) | batch | tokens | verify ms | draft ms | step ms |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['routing']} | {r['budget']} ({r['width']}) | {r['batch']} | {r['tokens']} | {r['verify_ms']:.2f}"
                  f" | {r['draft_ms']:.2f} | {r['step_ms']:.2f} |" for r in rig.verify]
    if rig.errors:
        lines += ["", "errors: " + " / ".join(rig.errors)]
    return "\n".join(lines)


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"{what} {text!r} is invalid: expected comma-separated positive integers, e.g. 1,8,16") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{what} {text!r} is invalid: expected comma-separated positive integers, e.g. 1,8,16")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=("write", "decode", "verify", "experts", "report"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=40, help="layers of the rank's slice (Kimi K2.6: 61)")
    ap.add_argument("--routing", default="uniform", help="uniform or round-robin (SGLang's routing simulation)")
    ap.add_argument("--tokens", default=",".join(map(str, DECODE_TOKENS)), help="T of the decode forwards")
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--loads", default=",".join(map(str, LOADS)))
    ap.add_argument("--timeout", type=float, default=480, help="seconds for one server's start / one bench")
    ap.add_argument("--gpu", default="", help="the GPU's name for the report")
    args = ap.parse_args(argv)
    tokens, budgets, loads = (parse_ints(args.tokens, "--tokens"), parse_ints(args.budgets, "--budgets"),
                              parse_ints(args.loads, "--loads"))
    try:
        if args.step == "write":
            print(f"[rig] {write_rig(args.out, args.layers)}")
        elif args.step == "decode":
            print(f"[rig] {run_decode(args.out, args.routing, tokens, args.timeout)}")
        elif args.step == "verify":
            print(f"[rig] {run_verify(args.out, args.routing, budgets, loads, args.timeout)}")
        elif args.step == "experts":
            path = args.out / "experts.json"
            path.write_text(json.dumps({**distinct_experts(tokens, args.layers), "copy_gbps": copy_bandwidth()}))
            print(f"[rig] {path}")
        else:
            rig = gather(args.out, args.layers, args.gpu, time.strftime("%Y-%m-%d"))
            (args.out / "rig.json").write_text(json.dumps(asdict(rig), indent=1))
            print(table(rig))
    except ValueError as err:
        print(f"kimi_rank: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
