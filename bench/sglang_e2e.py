"""NONE vs DFLASH vs DDTREE inside the real SGLang 0.5.23 server, side by side (the GPU test bed).

Run on the GPU machine from the project root, after staging the test bed and with the pair in
SGLang's formats (testbed/run.sh makes both):

    . .gpu-bundles/bin/env.sh
    python3 bench/sglang_e2e.py --pair DIR --prompts heldout_prompts.json --out OUT [--quick]

One server per configuration (testbed/servers.py; all started together, measured one at a
time so that no two share the GPU while timed): NONE, DFLASH and DDTREE at budgets
8/16/32/64/128 x caps 4/8/budget, CUDA graphs on. For each: batch 1 (one request at a time) and
batch 8 (8 in flight), temperature 0 and 0.7 (top-p 0.9, top-k 50), the held-out prompts x
--max-new-tokens, after a warm-up of `batch` short requests in flight (batch sizes up to it run before timing),
--repeats times (the median run is the row; all wall times are kept). Columns: output tokens/s (client wall clock over the whole set), accept length
(SGLang's spec_accept_length, mean over requests), tokens per verify step (decoded tokens /
spec_verify_ct), client step time (batch 1: request latency / (verify steps + 1)), SGLang's own
device time of a step's forward passes (sglang:forward_execution_seconds_total over the measured
span / request steps; target verify + draft for DFLASH/DDTREE, the decode pass for NONE), tokens
per device second (decoded tokens / that device time: what the GPU sustains if the host took no
time - the step here is host-bound, the production host's is not), at temperature 0 how many
outputs equal NONE's, and SGLang's own split of a request (meta_info): ms before the first token, ms per decode step
after it. Writes OUT/results.json, OUT/table.md and
OUT/tokens_per_s.png; prints the table.

Where the time goes: `--profile NAME,...` adds, for each DDTREE configuration named, a second
server with the worker's step profiler on (ddtree.sglang.diagnostics.profile: every stage timed with a device
synchronisation after it, so it runs slower and is kept out of the speed table), measured at each
batch size at temperature 0; its medians per stage go to OUT/profile.md. `--trace NAME,...` takes
SGLang's own torch-profiler trace (CPU + GPU, /start_profile) of a few steps of one request on
those servers (any algorithm) into OUT/traces/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed import servers

BUDGETS = (8, 16, 32, 64, 128)
CAPS = ("4", "8", "budget")
SAMPLED = {"temperature": 0.7, "top_p": 0.9, "top_k": 50}


@dataclass
class Row:
    config: str
    algorithm: str
    budget: int | None
    cap: int | None
    block: int                      # the draft's block size (8, or 16 for the -k16 configurations)
    batch: int
    temperature: float
    tokens_per_s: float
    accept_length: float | None
    tokens_per_step: float | None
    step_ms: float | None           # batch 1 only: mean request latency / (verify steps + 1)
    forward_ms: float | None        # SGLang's forward device time (target + draft) per request step: at batch 8
                                    # a batched pass is shared by up to 8 requests' steps
    equal_to_none: str | None       # temperature 0: "k/n"
    requests: int
    walls: list[float] | None = None  # wall seconds of each repeat (the row is the median one's)
    device_tokens_per_s: float | None = None  # decoded tokens / SGLang's forward device seconds: the
                                              # throughput if the host took no time (CPU speed does not move it)
    first_token_ms: float | None = None     # mean of SGLang's first_token_latency: queue + prefill (+ the draft's)
    decode_step_ms: float | None = None     # mean (e2e_latency - first_token_latency) / the request's decode steps:
                                            # a step, with the stalls other requests' prefills put in it


K16 = ("dflash-k16", "ddtree-b16-c8-graphs-k16", "ddtree-b32-c8-graphs-k16", "ddtree-b64-c8-graphs-k16",
       "ddtree-b128-c8-graphs-k16", "ddtree-b64-c64-graphs-k16", "ddtree-b128-c128-graphs-k16")


def configurations(quick: bool, k16: bool) -> list[servers.ServerConfig]:
    extra = [servers.config(n) for n in K16] if k16 else []
    if quick:
        return [servers.NONE, servers.DFLASH, servers.ddtree(32, 8), servers.ddtree(64, 8), *extra]
    trees = []
    for b in BUDGETS:
        for cap in CAPS:
            c = b if cap == "budget" else int(cap)
            if c <= b and servers.ddtree(b, c).name not in {t.name for t in trees}:
                trees.append(servers.ddtree(b, c))
    return [servers.NONE, servers.DFLASH, *trees, *extra]


def block_of(cfg: servers.ServerConfig) -> int:
    return 16 if cfg.draft == "draft16" else 8


@dataclass
class Measurement:
    answers: list[dict]
    wall: float                     # seconds, client clock, the whole set
    latencies: list[float]          # seconds per request
    forward_s: float | None         # SGLang's device time of the decode-side forward passes in that span


def measure(server: servers.Server, prompts: list[list[int]], batch: int, temperature: float,
            max_new_tokens: int) -> Measurement:
    """All prompts with `batch` requests in flight."""
    sampling = {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                **({"temperature": 0.0} if temperature == 0 else {**SAMPLED, "temperature": temperature})}
    latencies: list[float] = []

    def one(prompt):
        t0 = time.perf_counter()
        answer = server.generate(prompt, sampling)
        latencies.append(time.perf_counter() - t0)
        return answer

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=batch) as pool:                      # warm every batch size up to
        list(pool.map(lambda p: server.generate(p, {**sampling, "max_new_tokens": 32}), prompts[:batch]))
    forward0 = server.forward_seconds()
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=batch) as pool:
        answers = list(pool.map(one, prompts))
    wall = time.perf_counter() - start
    forward1 = server.forward_seconds()
    forward = forward1 - forward0 if forward0 is not None and forward1 is not None else None
    return Measurement(answers, wall, latencies, forward)


@dataclass(frozen=True)
class RequestSplit:
    """Where a request's time went, from SGLang's own meta_info (0.5.23 sends first_token_latency and e2e_latency
    with --enable-metrics): before the first token, and per decode step after it. None where no answer has both."""

    first_token_ms: float | None
    decode_step_ms: float | None


def request_steps(answer: dict, spec: bool) -> int:
    """A request's decode steps: its verify steps (spec_verify_ct) when speculative, else its output tokens - 1 (the
    first token comes from the prefill)."""
    return answer["meta_info"].get("spec_verify_ct", 0) if spec else len(answer["output_ids"]) - 1


def request_split(answers: list[dict], spec: bool) -> RequestSplit:
    """Mean first-token latency (ms) and mean decode ms per step over the answers that carry both latencies; a
    request's decode steps are its spec_verify_ct (speculative) or its output tokens - 1 (NONE)."""
    firsts, steps = [], []
    for a in answers:
        m = a["meta_info"]
        first, e2e_s = m.get("first_token_latency"), m.get("e2e_latency")
        if first is None or e2e_s is None:
            continue
        firsts.append(first)
        n = request_steps(a, spec)
        if n > 0:
            steps.append((e2e_s - first) / n)
    return RequestSplit(round(1000 * statistics.fmean(firsts), 3) if firsts else None,
                        round(1000 * statistics.fmean(steps), 3) if steps else None)


def summarize(cfg: servers.ServerConfig, batch: int, temperature: float, answers: list[dict], wall: float,
              latencies: list[float], none_outputs: list[list[int]] | None, forward_s: float | None = None) -> Row:
    bad = [a for a in answers if "output_ids" not in a]
    if bad:
        raise RuntimeError(f"{cfg.name}: {len(bad)} requests failed, e.g. {bad[0]}")
    tokens = sum(len(a["output_ids"]) for a in answers)
    metas = [a["meta_info"] for a in answers]
    spec = cfg.algorithm != "NONE"
    steps = sum(m.get("spec_verify_ct", 0) for m in metas) if spec else 0
    step_ms = None
    if batch == 1:
        per_step = [lat / (request_steps(a, spec) + 1) for lat, a in zip(latencies, answers)]
        step_ms = round(1000 * statistics.fmean(per_step), 3)
    decode_steps = sum(request_steps(a, spec) for a in answers)
    forward_ms = round(1000 * forward_s / decode_steps, 3) if forward_s and decode_steps else None
    decoded = tokens - len(answers)                      # the first token of each request comes from the prefill
    device_tps = round(decoded / forward_s, 1) if forward_s else None
    equal = None
    if none_outputs is not None:
        same = sum(a["output_ids"] == n for a, n in zip(answers, none_outputs))
        equal = f"{same}/{len(answers)}"
    split = request_split(answers, spec)
    return Row(config=cfg.name, algorithm=cfg.algorithm, budget=cfg.budget, cap=cfg.cap, block=block_of(cfg),
               batch=batch,
               temperature=temperature, tokens_per_s=round(tokens / wall, 1),
               accept_length=round(statistics.fmean(m["spec_accept_length"] for m in metas), 3) if spec else None,
               tokens_per_step=round((tokens - len(answers)) / steps, 3) if spec and steps else None,
               step_ms=step_ms, forward_ms=forward_ms, equal_to_none=equal, requests=len(answers),
               device_tokens_per_s=device_tps, first_token_ms=split.first_token_ms,
               decode_step_ms=split.decode_step_ms)


@dataclass
class ProfileRow:
    config: str
    batch: int
    steps: int
    stages: dict[str, tuple[float, float]]      # median ms (host, total) per stage


def profile_rows(server: servers.Server, prompts: list[list[int]], batches: list[int],
                 max_new_tokens: int) -> list[ProfileRow]:
    """Drive a profiled server at each batch size (temperature 0) and read its last line per batch size."""
    from ddtree.sglang.diagnostics.profile import parse_profile_lines

    for batch in batches:
        measure(server, prompts, batch, 0.0, max_new_tokens)
    last = {p.batch_size: p for p in parse_profile_lines(server.log_text())}
    name = server.config.name.removesuffix(servers.PROFILE_SUFFIX)
    return [ProfileRow(name, b, last[b].steps, last[b].stages) for b in batches if b in last]


def profile_table(rows: list[ProfileRow]) -> str:
    stages = list(dict.fromkeys(s for r in rows for s in r.stages))
    out = ["| configuration | batch | " + " | ".join(stages) + " |", "|---|---|" + "---|" * len(stages)]
    for r in rows:
        cells = [f"{r.stages[s][0]:.3f} / {r.stages[s][1]:.3f}" if s in r.stages else "" for s in stages]
        out.append(f"| {r.config} | {r.batch} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def table(rows: list[Row]) -> str:
    out = ["| configuration | block | batch | T | tokens/s | accept length | tokens / verify step | step ms (batch 1) | "
           "SGLang forward ms / request step | tokens / device s | T=0 equal to NONE | first token ms | "
           "decode step ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(v):
            return "" if v is None else v
        out.append(f"| {r.config} | {r.block} | {r.batch} | {r.temperature:g} | {r.tokens_per_s} | "
                   f"{f(r.accept_length)} | {f(r.tokens_per_step)} | {f(r.step_ms)} | {f(r.forward_ms)} | "
                   f"{f(r.device_tokens_per_s)} | {f(r.equal_to_none)} | {f(r.first_token_ms)} | "
                   f"{f(r.decode_step_ms)} |")
    return "\n".join(out)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({(r.batch, r.temperature) for r in rows})
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4), squeeze=False)
    def line(r: Row) -> str:
        return f"cap {'budget' if r.cap == r.budget else r.cap}, block {r.block}"

    for ax, (batch, temp) in zip(axes[0], settings):
        sel = [r for r in rows if r.batch == batch and r.temperature == temp]
        for label in sorted({line(r) for r in sel if r.algorithm == "DDTREE"}):
            pts = sorted((r.budget, r.tokens_per_s) for r in sel if r.algorithm == "DDTREE" and line(r) == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"DDTREE {label}")
        for r in sel:
            if r.algorithm == "NONE":
                ax.axhline(r.tokens_per_s, linestyle=":", color="gray", label="NONE")
            elif r.algorithm == "DFLASH":
                ax.axhline(r.tokens_per_s, linestyle="--" if r.block == 8 else "-.", color="black",
                           label=f"DFLASH block {r.block}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"batch {batch}, temperature {temp:g}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", required=True, help="the pair in SGLang's formats (target/, draft/)")
    ap.add_argument("--prompts", required=True, help="JSON list of token-id prompts (held-out)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure each (batch, temperature) this many times; the median wall time's run is the row")
    ap.add_argument("--configs", default="", help="comma list of configuration names (default: the full matrix)")
    ap.add_argument("--quick", action="store_true", help="NONE, DFLASH, DDTREE b32 c8 and b64 c8 only")
    ap.add_argument("--k16", action="store_true", help="add DFLASH and DDTREE on the pair's block-16 draft (draft16)")
    ap.add_argument("--profile", default="", help="DDTREE configurations to profile per stage (a second server each)")
    ap.add_argument("--trace", default="", help="configurations to take a torch-profiler trace of")
    ap.add_argument("--start-timeout", type=float, default=900)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads(Path(args.prompts).read_text())[: args.num_prompts]
    prompts = [p[: 1 + 16 + 15 * i] for i, p in enumerate(raw)]                # different lengths
    configs = ([servers.config(n) for n in args.configs.split(",")] if args.configs
               else configurations(args.quick, args.k16))
    batches = [int(b) for b in args.batches.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    profiled = [n + servers.PROFILE_SUFFIX for n in args.profile.split(",") if n]
    traced = [n for n in args.trace.split(",") if n]
    fleet = servers.Fleet(Path(args.pair), out / "logs")
    rows: list[Row] = []
    prows: list[ProfileRow] = []
    try:
        ready = fleet.start([c.name for c in configs] + profiled, timeout=args.start_timeout)
        for name, ok in ready.items():
            if not ok:
                print(f"{name} did not start: {fleet.servers[name].exit_message()}", flush=True)
        none_outputs: dict[int, list[list[int]]] = {}
        for cfg in configs:
            if not ready.get(cfg.name):
                continue
            server = fleet.servers[cfg.name]
            for batch in batches:
                for temp in temps:
                    runs = [measure(server, prompts, batch, temp, args.max_new_tokens) for _ in range(args.repeats)]
                    run = sorted(runs, key=lambda r: r.wall)[len(runs) // 2]             # the median wall time
                    if cfg.algorithm == "NONE" and temp == 0:
                        none_outputs[batch] = [a["output_ids"] for a in run.answers]
                    reference = none_outputs.get(batch) if temp == 0 and cfg.algorithm != "NONE" else None
                    rows.append(summarize(cfg, batch, temp, run.answers, run.wall, run.latencies, reference,
                                          run.forward_s))
                    rows[-1].walls = [round(r.wall, 4) for r in runs]
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
                    (out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
        for name in profiled:
            if ready.get(name):
                prows += profile_rows(fleet.servers[name], prompts, batches, args.max_new_tokens)
                print(profile_table(prows), flush=True)
        for name in traced:
            if ready.get(name):
                files = fleet.servers[name].torch_trace(out / "traces" / name, prompts[-1],
                                                        servers.greedy(128), steps=16)
                print(f"{name}: trace files {[f.name for f in files]}", flush=True)
    finally:
        fleet.stop_all()
    if prows:
        (out / "profile.md").write_text(profile_table(prows) + "\n")
        (out / "profile.json").write_text(json.dumps([asdict(r) for r in prows], indent=1))
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)
    if rows:
        plot(rows, out / "tokens_per_s.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
