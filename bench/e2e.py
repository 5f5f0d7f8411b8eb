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
import os
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
    temperature: float
    step_ms: float
    tokens_per_s: float
    tokens_per_step: float
    stage_ms: dict
    tree_share: float    # (build + verify) / sum of stages
    offline_tokens_per_step: float | None = None   # temperature 0, bs 1: the offline count (a check)


class Mark:
    """A point in time on the device: a CUDA event on a GPU, the host clock on the CPU (eager only)."""

    def __init__(self, device: torch.device):
        self.event = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        self.t = 0.0

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
        else:
            self.t = time.perf_counter()

    def ms_until(self, other: "Mark") -> float:
        if self.event is not None:
            return self.event.elapsed_time(other.event)
        return (other.t - self.t) * 1e3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def stage_events(n: int, device: torch.device) -> list[tuple[Mark, Mark]]:
    return [(Mark(device), Mark(device)) for _ in range(n)]


def timed_stages(decoder: Decoder, state) -> list[tuple[str, float]]:
    """One step with a mark pair around each stage (eager) or each stage's graph (split capture)."""
    names = [name for name, _ in decoder.stages()]
    marks = stage_events(len(names), decoder.device)
    decoder.step(state, marks)
    return [(name, a.ms_until(b)) for name, (a, b) in zip(names, marks)]


def case_prompts(pair: Pair, bs: int, args) -> list[list[list[int]]]:
    """Batches of prompts: held-out prompts from --prompts (cycled), else random tokens."""
    if args.prompts:
        pool = json.load(open(args.prompts))
    else:
        g = torch.Generator().manual_seed(bs)
        vocab = pair.target.config.vocab_size
        pool = [torch.randint(4, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(max(bs, 1))]
    rounds = max(1, args.num_prompts // bs) if args.prompts else 1
    return [[pool[(r * bs + i) % len(pool)] for i in range(bs)] for r in range(rounds)]


def decode_rounds(decoder: Decoder, batches, req: RequestParams, args) -> tuple[float, int, int, list]:
    """Warm-up + timed steps per batch; -> (seconds timed, tokens emitted timed, steps timed, states)."""
    seconds, emitted, steps, states = 0.0, 0, 0, []
    for r, prompts in enumerate(batches):
        state = decoder.start(prompts, [req] * len(prompts), seed=r)
        for _ in range(args.warmup):
            decoder.step(state)
        sync(decoder.device)
        before = sum(len(o.tokens) for o in state.outputs)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            decoder.step(state)
        sync(decoder.device)
        seconds += time.perf_counter() - t0
        emitted += sum(len(o.tokens) for o in state.outputs) - before
        steps += args.steps
        decoder.cancel(state)              # frees the graph bucket for the next batch
        states.append(state)
    return seconds, emitted, steps, states


_CONTINUATIONS: dict[tuple[int, ...], list[int]] = {}


def greedy_continuation(pair: Pair, prompt: list[int], n: int) -> list[int]:
    """The target's greedy continuation (n tokens), decoded once per prompt and kept."""
    key = tuple(prompt)
    if len(_CONTINUATIONS.get(key, ())) < n:
        decoder = Decoder(pair, "ar", cuda_graphs=pair.target.lm_head.weight.is_cuda)
        state = decoder.start([prompt], [RequestParams(max_new_tokens=n)])
        while not state.done:
            decoder.step(state)
        _CONTINUATIONS[key] = state.outputs[0].tokens
    return _CONTINUATIONS[key][:n]


def offline_check(pair: Pair, budget: int, cap: int, states, args) -> float:
    """Tokens per step by the offline count over the same prompts and token counts as the engine."""
    from ddtree.reference.offline import offline_accept_lengths

    depth = pair.block_size - 1
    longest = (args.warmup + args.steps + 2) * (depth + 1) + depth + 1
    steps = tokens = 0
    for state in states:
        for prompt, out in zip(state.prompts, state.outputs):
            # as many steps as the engine took for this request (not as many tokens: see offline.py)
            accepts = offline_accept_lengths(pair, prompt, greedy_continuation(pair, prompt, longest),
                                             budget=budget, topk_cap=cap, max_steps=out.num_verify_steps)
            steps += len(accepts)
            tokens += sum(a + 1 for a in accepts)
    return tokens / steps


def run_case(pair: Pair, method: str, budget: int, cap: int, bs: int, graphs: bool, temperature: float,
             args) -> Row:
    batches = case_prompts(pair, bs, args)
    req = RequestParams(max_new_tokens=(args.warmup + args.steps + 2) * pair.block_size, temperature=temperature)
    # whole-step timing over every batch of prompts
    decoder = Decoder(pair, method, budget, cap, cuda_graphs=graphs)
    seconds, emitted, steps, states = decode_rounds(decoder, batches, req, args)
    for state, prompts in zip(states, batches):
        state.prompts = prompts
    offline = None
    if args.offline_check and temperature == 0 and bs == 1 and method != "ar":
        offline = offline_check(pair, decoder.budget, decoder.topk_cap, states, args)
    # per-stage device time on the first batch (eager: events between stages; graphs: one graph per stage)
    staged = Decoder(pair, method, budget, cap, cuda_graphs=graphs, split_stages=True)
    sstate = staged.start(batches[0], [req] * bs, seed=0)
    totals: dict[str, float] = {}
    for i in range(args.warmup + args.steps):
        for name, ms in timed_stages(staged, sstate):
            if i >= args.warmup:
                totals[name] = totals.get(name, 0.0) + ms / args.steps
    if graphs and (sstate.graph_bucket is None or any(st.graph_bucket is None for st in states)):
        raise RuntimeError(f"{method} budget {budget}: a batch fell back to eager decoding in a graphs case")
    all_steps = sum(o.num_verify_steps for st in states for o in st.outputs)
    all_tokens = sum(len(o.tokens) for st in states for o in st.outputs)
    decoder.close()                        # graphs released before the next case captures its own
    staged.close()
    del decoder, states, staged, sstate
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    total = sum(totals.values())
    return Row(method=method, budget=budget, cap=cap, bs=bs, mode="graphs" if graphs else "eager",
               temperature=temperature, step_ms=seconds / steps * 1e3, tokens_per_s=emitted / seconds,
               tokens_per_step=all_tokens / max(all_steps, 1), stage_ms={k: round(v, 4) for k, v in totals.items()},
               tree_share=(totals.get("build", 0.0) + totals.get("verify", 0.0)) / total if total else 0.0,
               offline_tokens_per_step=offline)


@dataclass(frozen=True)
class Case:
    method: str
    budget: int
    cap: int
    bs: int
    temperature: float
    mode: str

    def key(self) -> str:
        return f"{self.method},{self.budget},{self.cap},{self.bs},{self.temperature},{self.mode}"

    @classmethod
    def parse(cls, text: str) -> "Case":
        m, b, c, bs, t, mode = text.split(",")
        return cls(m, int(b), int(c), int(bs), float(t), mode)


def cases(pair: Pair, args) -> list[Case]:
    """ar and the chain once per (bs, temperature, mode), then DDTree per budget x cap ('budget' = no cap)."""
    depth = pair.block_size - 1
    specs = [("ar", 1, 1), ("dflash", depth, 1)]
    for b in [int(x) for x in args.budgets.split(",")]:
        caps = sorted({b if c == "budget" else min(int(c), b) for c in args.caps.split(",")})
        specs += [("ddtree", b, c) for c in caps]
    return [Case(m, b, c, bs, t, mode) for bs in [int(x) for x in args.batches.split(",")]
            for t in [float(x) for x in args.temperatures.split(",")] for (m, b, c) in specs
            for mode in args.modes.split(",")]


def table(rows: list[Row]) -> str:
    head = ("| method | budget | cap | bs | temp | mode | step ms | tok/s | tok/step | offline tok/step | draft | "
            "build | target | verify | accept | tree % |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        st = [f"{r.stage_ms[s]:.3f}" if s in r.stage_ms else "-" for s in STAGES]
        off = f"{r.offline_tokens_per_step:.2f}" if r.offline_tokens_per_step is not None else "-"
        lines.append(f"| {r.method} | {r.budget} | {r.cap} | {r.bs} | {r.temperature:g} | {r.mode} | "
                     f"{r.step_ms:.3f} | {r.tokens_per_s:.0f} | {r.tokens_per_step:.2f} | {off} | " + " | ".join(st) +
                     f" | {100 * r.tree_share:.1f} |")
    return "\n".join(lines)


def speedups(rows: list[Row]) -> str:
    """Graphs against eager per case: step-time ratio (only where both modes ran)."""
    by = {(r.method, r.budget, r.cap, r.bs, r.temperature, r.mode): r for r in rows}
    lines = ["| method | budget | cap | bs | temp | eager ms | graphs ms | graphs speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for (m, b, c, bs, t, mode), r in by.items():
        if mode != "eager" or (m, b, c, bs, t, "graphs") not in by:
            continue
        g = by[(m, b, c, bs, t, "graphs")]
        lines.append(f"| {m} | {b} | {c} | {bs} | {t:g} | {r.step_ms:.3f} | {g.step_ms:.3f} | "
                     f"{r.step_ms / g.step_ms:.2f}x |")
    return "\n".join(lines) if len(lines) > 2 else ""


def best_budgets(rows: list[Row]) -> str:
    """Per (bs, temperature, mode): the fastest DDTree against the chain and AR."""
    lines = ["| bs | temp | mode | best DDTree (budget, cap) | tok/s | vs chain | vs AR | tok/step vs chain |",
             "|---|---|---|---|---|---|---|---|"]
    groups = sorted({(r.bs, r.temperature, r.mode) for r in rows})
    for bs, t, mode in groups:
        group = [r for r in rows if (r.bs, r.temperature, r.mode) == (bs, t, mode)]
        trees = [r for r in group if r.method == "ddtree"]
        chain = next((r for r in group if r.method == "dflash"), None)
        ar = next((r for r in group if r.method == "ar"), None)
        if not trees or chain is None or ar is None:
            continue
        best = max(trees, key=lambda r: r.tokens_per_s)
        lines.append(f"| {bs} | {t:g} | {mode} | {best.budget}, {best.cap} | {best.tokens_per_s:.0f} | "
                     f"{best.tokens_per_s / chain.tokens_per_s:.2f}x | {best.tokens_per_s / ar.tokens_per_s:.2f}x | "
                     f"{best.tokens_per_step / chain.tokens_per_step:.2f}x |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(rows: list[Row], path: str, title: str) -> None:
    """tok/s and tok/step against budget, one line per cap; chain and AR as horizontal lines (graph rows,
    or eager rows when no graph ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mode = "graphs" if any(r.mode == "graphs" for r in rows) else "eager"
    groups = sorted({(r.bs, r.temperature) for r in rows if r.mode == mode})
    fig, axes = plt.subplots(2, len(groups), figsize=(4.5 * len(groups), 7), squeeze=False)
    for col, (bs, t) in enumerate(groups):
        group = [r for r in rows if r.mode == mode and (r.bs, r.temperature) == (bs, t)]
        for row_ix, (attr, label) in enumerate((("tokens_per_s", "tokens/s"), ("tokens_per_step", "tokens/step"))):
            ax = axes[row_ix][col]
            trees = [r for r in group if r.method == "ddtree"]
            for cap_label in sorted({"budget" if r.cap == r.budget else str(r.cap) for r in trees}):
                line = sorted((r for r in trees if ("budget" if r.cap == r.budget else str(r.cap)) == cap_label),
                              key=lambda r: r.budget)
                ax.plot([r.budget for r in line], [getattr(r, attr) for r in line], marker="o",
                        label=f"DDTree cap {cap_label}")
            for method, style in (("dflash", "--"), ("ar", ":")):
                ref = next((r for r in group if r.method == method), None)
                if ref is not None:
                    ax.axhline(getattr(ref, attr), linestyle=style, color="k",
                               label="DFlash chain" if method == "dflash" else "AR")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget (tree nodes)")
            ax.set_ylabel(label)
            ax.set_title(f"batch {bs}, temperature {t:g}, {mode}")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", help="a pair directory (load_pair); default: the random ~1.1B target")
    ap.add_argument("--prompts", help="JSON list of prompts (token lists), e.g. DIR/heldout_prompts.json")
    ap.add_argument("--num-prompts", type=int, default=16, help="prompts per case with --prompts (bs 1: that many batches)")
    ap.add_argument("--block-size", type=int, default=16, help="draft block of the random pair (L = block - 1)")
    ap.add_argument("--budgets", default="8,32,128")
    ap.add_argument("--caps", default="8", help="comma list; 'budget' = no cap")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--temperatures", default="0")
    ap.add_argument("--modes", default="eager,graphs")
    ap.add_argument("--prompt-len", type=int, default=256, help="random prompts' length (without --prompts)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--offline-check", action="store_true",
                    help="temperature 0, bs 1: also count acceptance offline along the target's greedy continuation")
    ap.add_argument("--in-process", action="store_true", help="run every case in this process (small pairs)")
    ap.add_argument("--quick", action="store_true", help="budgets 8,32, batch 1, 5 steps")
    ap.add_argument("--out", help="write the markdown tables here")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--png", help="write the budget plot here (graph rows)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs eager mode only (a smoke test)")
    ap.add_argument("--resume", action="store_true",
                    help="with --json: keep the rows already in that file and run only the missing cases")
    ap.add_argument("--render", nargs="+", metavar="JSON",
                    help="no measuring: merge the rows of these --json files into the tables (--out) and plot (--png)")
    ap.add_argument("--case", help=argparse.SUPPRESS)   # one Case.key(): run it alone, JSON row on stdout
    args = ap.parse_args(argv)
    if args.quick:
        args.budgets, args.batches, args.steps = "8,32", "1", 5
    return args


def load(args) -> Pair:
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return load_pair(args.pair, device=args.device, dtype=dtype)


def measure(pair: Pair, case: Case, args) -> Row:
    torch.manual_seed(0)
    return run_case(pair, case.method, case.budget, case.cap, case.bs, case.mode == "graphs", case.temperature, args)


def run_one(args) -> int:
    """--case: one measurement in this (fresh) process; prints its Row as JSON."""
    print("ROW " + json.dumps(asdict(measure(load(args), Case.parse(args.case), args))))
    return 0


def in_subprocess(case: Case, argv: list[str]) -> Row:
    done = subprocess.run([sys.executable, __file__, *argv, "--case", case.key()], capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("ROW ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"case {case.key()} failed:\n{done.stderr[-3000:]}")
    return Row(**json.loads(line[4:]))


def case_of(row: Row) -> Case:
    return Case(row.method, row.budget, row.cap, row.bs, row.temperature, row.mode)


def read_rows(path: str) -> tuple[str, list[Row]]:
    """(header, rows) of a --json file; header 'partial' for a run that was cut short."""
    data = json.load(open(path))
    return data["header"], [Row(**r) for r in data["rows"]]


def report(header: str, rows: list[Row], args) -> None:
    """Tables on stdout and --out, rows to --json, the plot to --png."""
    text = "\n\n".join(x for x in (header, table(rows), speedups(rows), best_budgets(rows)) if x) + "\n"
    print(text)
    if args.out:
        open(args.out, "w").write(text)
    if args.json:
        json.dump({"header": header, "rows": [asdict(r) for r in rows]}, open(args.json, "w"), indent=1)
    if args.png:
        plot(rows, args.png, header)


def render(args) -> int:
    """--render: merge saved rows (later files win for the same case) and report them."""
    headers, merged = [], {}
    for path in args.render:
        header, rows = read_rows(path)
        headers.append(header)
        merged.update({case_of(r): r for r in rows})
    header = next((h for h in headers if h != "partial"), "partial")
    args.json = None
    report(header, list(merged.values()), args)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.render:
        return render(args)
    if args.resume and not args.json:
        print("bench/e2e.py: --resume needs --json FILE (the rows to keep)", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/e2e.py: no CUDA GPU here (use --device cpu --modes eager for a smoke test)", file=sys.stderr)
        return 2
    if args.device == "cpu" and "graphs" in args.modes:
        print("bench/e2e.py: --modes graphs needs --device cuda", file=sys.stderr)
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
        rows = read_rows(args.json)[1] if args.resume and os.path.exists(args.json) else []
        done = {case_of(r) for r in rows}
        if done:
            print(f"resuming: {len(done)} cases already in {args.json}", flush=True)
        for case in cases(pair, args):
            if case in done:
                continue
            row = measure(pair, case, args) if args.in_process else in_subprocess(case, argv)
            rows.append(row)
            if args.json:                  # kept after every case: a cut-short run keeps what it measured
                json.dump({"header": "partial", "rows": [asdict(r) for r in rows]}, open(args.json, "w"), indent=1)
            off = f" offline {row.offline_tokens_per_step:.2f}" if row.offline_tokens_per_step is not None else ""
            print(f"{case.method:6s} budget {case.budget:4d} cap {case.cap:3d} bs {case.bs:2d} t {case.temperature:g} "
                  f"{case.mode:6s} step {row.step_ms:8.3f} ms {row.tokens_per_s:9.0f} tok/s "
                  f"{row.tokens_per_step:5.2f} tok/step{off} tree {100 * row.tree_share:5.1f}%", flush=True)
    source = f"pair {args.pair}" if args.prompts else "random pair"
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    header = (f"{time.strftime('%Y-%m-%d')}, {gpu}, torch {torch.__version__}, "
              f"python {platform.python_version()}; {source}: target {params / 1e9:.3f}B parameters "
              f"{'bf16' if args.device == 'cuda' else 'float32'}, draft "
              f"{draft_layers} layers, block {block}; {args.warmup} warm-up + {args.steps} timed steps per batch"
              + (f", {args.num_prompts} held-out prompts per case" if args.prompts else
                 f", random prompts of {args.prompt_len}")
              + ("" if args.in_process else ", one process per case"))
    report(header, rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
