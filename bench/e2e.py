"""End-to-end decode steps of the reference engine on a GPU: eager against CUDA graphs.

Run on a CUDA GPU (the lent H200):  PYTHONPATH=src python3 bench/e2e.py [--quick] [--out FILE]

For ar, the DFlash chain (budget = L, cap 1) and DDTree at each budget, for each batch size and
for eager and CUDA-graph decoding, it prefills a batch of random prompts and times decode steps:
  step_ms      wall time of one whole step (launch or replay, plus the host commit, the step's
               one synchronisation), averaged over --steps steps after warm-up;
  tok/s        tokens emitted per second over those steps (all requests);
  tok/step     tokens per request per verify step (1 for ar; 1 + accepted draft tokens);
  stages       device time of each stage (draft, build, target, verify, accept) from CUDA events
               around each stage (eager) or around each stage's own graph (graphs, split capture);
  tree %       (build + verify) / sum of stages: the DDTree algorithm's share of a step.
The default target is about 1.1B parameters of random bf16 weights (memory-bound steps like real
serving); a random pair accepts almost nothing, so tok/step is about 1 for every method here.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

from ddtree.reference.config import DraftConfig, TargetConfig
from ddtree.reference.engine import Decoder, RequestParams
from ddtree.reference.pair import Pair, init_pair, load_pair, save_pair

STAGES = ("draft", "build", "target", "verify", "accept")


def one_b_pair(block_size: int) -> Pair:
    """~1.1B-parameter target (16 layers, width 2048, SwiGLU 8192, vocab 32k) + a 2-layer draft."""
    target = TargetConfig(vocab_size=32_000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                          num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                          max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
    draft = DraftConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, block_size=block_size,
                        target_layer_ids=[1, 8, 14], mask_token_id=3)
    return init_pair(target, draft, seed=0)


@dataclass
class Row:
    method: str
    budget: int
    cap: int
    bs: int
    mode: str            # eager | graphs
    step_ms: float
    tokens_per_s: float
    tokens_per_step: float
    stage_ms: dict
    tree_share: float    # (build + verify) / sum of stages


def stage_events(n: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def timed_eager_stages(decoder: Decoder, state) -> list[tuple[str, float]]:
    """One eager step with an event pair around each stage; returns (stage, ms) after the commit."""
    stages = decoder.stages()
    events = stage_events(len(stages))
    io = decoder.step_io(state)
    with torch.no_grad():
        for (_, stage), (a, b) in zip(stages, events):
            a.record()
            stage(io)
            b.record()
    decoder.finish_step(state, io)
    return [(name, a.elapsed_time(b)) for (name, _), (a, b) in zip(stages, events)]


def timed_graph_stages(decoder: Decoder, state) -> list[tuple[str, float]]:
    """One step replaying the split capture's stage graphs with an event pair around each."""
    runner = decoder.graphs
    cap = runner.captured(state)
    events = stage_events(len(cap.graphs))
    cap.registry.copy_in(runner._sources(state), "replay")
    for (_, graph), (a, b) in zip(cap.graphs, events):
        a.record()
        graph.replay()
        b.record()
    n = len(state.requests)
    state.roots.copy_(cap.io.roots[:n])
    state.lengths.copy_(cap.io.lengths[:n])
    from ddtree.reference.engine import StepIO

    io = StepIO(roots=state.roots, lengths=state.lengths, live=state.live, params=state.params,
                generator=state.generator, cache=state.cache, ctx=state.ctx, emitted=cap.io.emitted[:n],
                accept=cap.io.accept[:n], node_logits=cap.io.node_logits[:n])
    decoder.finish_step(state, io)
    return [(name, a.elapsed_time(b)) for (name, _), (a, b) in zip(cap.graphs, events)]


def run_case(pair: Pair, method: str, budget: int, cap: int, bs: int, graphs: bool, args) -> Row:
    vocab = pair.target.config.vocab_size
    g = torch.Generator().manual_seed(bs)
    prompts = [torch.randint(4, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(bs)]
    req = RequestParams(max_new_tokens=(args.warmup + args.steps + 2) * pair.block_size, temperature=args.temperature)
    # whole-step timing
    decoder = Decoder(pair, method, budget, cap, cuda_graphs=graphs)
    state = decoder.start(prompts, [req] * bs, seed=0)
    for _ in range(args.warmup):
        decoder.step(state)
    torch.cuda.synchronize()
    emitted_before = sum(len(o.tokens) for o in state.outputs)
    steps_before = state.outputs[0].num_verify_steps
    t0 = time.perf_counter()
    for _ in range(args.steps):
        decoder.step(state)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    emitted = sum(len(o.tokens) for o in state.outputs) - emitted_before
    steps = state.outputs[0].num_verify_steps - steps_before
    # per-stage device time (eager: events between stages; graphs: one graph per stage)
    staged = Decoder(pair, method, budget, cap, cuda_graphs=graphs, split_stages=True)
    sstate = staged.start(prompts, [req] * bs, seed=0)
    timer = timed_graph_stages if graphs else timed_eager_stages
    totals: dict[str, float] = {}
    for i in range(args.warmup + args.steps):
        for name, ms in timer(staged, sstate):
            if i >= args.warmup:
                totals[name] = totals.get(name, 0.0) + ms / args.steps
    del decoder, state, staged, sstate
    torch.cuda.empty_cache()
    total = sum(totals.values())
    return Row(method=method, budget=budget, cap=cap, bs=bs, mode="graphs" if graphs else "eager",
               step_ms=seconds / args.steps * 1e3, tokens_per_s=emitted / seconds,
               tokens_per_step=emitted / max(steps, 1) / bs, stage_ms={k: round(v, 4) for k, v in totals.items()},
               tree_share=(totals.get("build", 0.0) + totals.get("verify", 0.0)) / total if total else 0.0)


def cases(pair: Pair, budgets: list[int], caps: list[int]) -> list[tuple[str, int, int]]:
    depth = pair.block_size - 1
    out = [("ar", 1, 1), ("dflash", depth, 1)]
    out += [("ddtree", b, min(c, b)) for b in budgets for c in caps]
    return out


def table(rows: list[Row]) -> str:
    head = ("| method | budget | cap | bs | mode | step ms | tok/s | tok/step | draft | build | target | "
            "verify | accept | tree % |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        st = [f"{r.stage_ms[s]:.3f}" if s in r.stage_ms else "-" for s in STAGES]
        lines.append(f"| {r.method} | {r.budget} | {r.cap} | {r.bs} | {r.mode} | {r.step_ms:.3f} | "
                     f"{r.tokens_per_s:.0f} | {r.tokens_per_step:.2f} | " + " | ".join(st) +
                     f" | {100 * r.tree_share:.1f} |")
    return "\n".join(lines)


def speedups(rows: list[Row]) -> str:
    """Graphs against eager per (method, budget, cap, bs): step-time ratio."""
    by = {(r.method, r.budget, r.cap, r.bs, r.mode): r for r in rows}
    lines = ["| method | budget | cap | bs | eager ms | graphs ms | graphs speed-up |", "|---|---|---|---|---|---|---|"]
    for (m, b, c, bs, mode), r in by.items():
        if mode != "eager" or (m, b, c, bs, "graphs") not in by:
            continue
        g = by[(m, b, c, bs, "graphs")]
        lines.append(f"| {m} | {b} | {c} | {bs} | {r.step_ms:.3f} | {g.step_ms:.3f} | {r.step_ms / g.step_ms:.2f}x |")
    return "\n".join(lines)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", help="a pair directory (load_pair); default: the random ~1.1B target")
    ap.add_argument("--block-size", type=int, default=16, help="draft block of the random pair (L = block - 1)")
    ap.add_argument("--budgets", default="8,32,128")
    ap.add_argument("--caps", default="8")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="eager,graphs")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="budgets 8,32, batch 1, 5 steps")
    ap.add_argument("--out", help="write the markdown tables here")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--case", help=argparse.SUPPRESS)   # method,budget,cap,bs,mode: one case, JSON row on stdout
    args = ap.parse_args(argv)
    if args.quick:
        args.budgets, args.batches, args.steps = "8,32", "1", 5
    return args


def load(args) -> Pair:
    pair = load_pair(args.pair, device="cuda", dtype=torch.bfloat16)
    return pair


def run_one(args) -> int:
    """--case: one measurement in this (fresh) process; prints its Row as JSON."""
    method, budget, cap, bs, mode = args.case.split(",")
    torch.manual_seed(0)
    row = run_case(load(args), method, int(budget), int(cap), int(bs), mode == "graphs", args)
    print("ROW " + json.dumps(asdict(row)))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if not torch.cuda.is_available():
        print("bench/e2e.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.case:
        return run_one(args)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.pair:                  # every case runs in its own process (clean allocator and
            args.pair = tmp                # cuBLAS state); they share the random pair through a file
            random_pair = one_b_pair(args.block_size)
            random_pair.target.to(torch.bfloat16)
            random_pair.draft.to(torch.bfloat16)
            save_pair(random_pair, tmp)
            del random_pair
            argv = argv + ["--pair", tmp]
        pair = load(args)
        params = sum(p.numel() for p in pair.target.parameters())
        block, draft_layers = pair.block_size, pair.draft.config.num_hidden_layers
        todo = cases(pair, [int(x) for x in args.budgets.split(",")], [int(x) for x in args.caps.split(",")])
        del pair
        rows = []
        for bs in [int(x) for x in args.batches.split(",")]:
            for method, budget, cap in todo:
                for mode in args.modes.split(","):
                    case = f"{method},{budget},{cap},{bs},{mode}"
                    done = subprocess.run([sys.executable, __file__, *argv, "--case", case], capture_output=True,
                                          text=True)
                    line = next((x for x in done.stdout.splitlines() if x.startswith("ROW ")), None)
                    if done.returncode != 0 or line is None:
                        print(f"case {case} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
                        return 1
                    row = Row(**json.loads(line[4:]))
                    rows.append(row)
                    print(f"{method:6s} budget {budget:4d} cap {cap:3d} bs {bs:2d} {mode:6s} step "
                          f"{row.step_ms:8.3f} ms {row.tokens_per_s:9.0f} tok/s tree {100 * row.tree_share:5.1f}%",
                          flush=True)
    header = (f"{time.strftime('%Y-%m-%d')}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"python {platform.python_version()}; target {params / 1e9:.2f}B parameters bf16, draft "
              f"{draft_layers} layers, block {block}, prompt {args.prompt_len}, "
              f"temperature {args.temperature}, {args.steps} timed steps, one process per case")
    text = header + "\n\n" + table(rows) + "\n\n" + speedups(rows) + "\n"
    print(text)
    if args.out:
        open(args.out, "w").write(text)
    if args.json:
        json.dump({"header": header, "rows": [asdict(r) for r in rows]}, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
