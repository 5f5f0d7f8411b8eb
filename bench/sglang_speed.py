"""NONE, DFLASH and DDTREE with and without SGLang's overlap scheduler, and DDTREE with the budget schedule this
sweep finds, side by side inside the real SGLang 0.5.23 server at 1, 8, 16, 32 and 48 running requests (issue 45,
item 3; the GPU test bed).

Run on the GPU machine from the project root after staging, with a pair in SGLang's formats (testbed/speed_sweep.sh
trains one, exports it and runs this):

    . .gpu-bundles/bin/env.sh
    python3 -m bench.sglang_speed --pair DIR --prompts heldout.json --train-prompts train.json --out OUT

Prompts: a mixed set - prompts cut from files the pair was trained on (its draft accepts long runs there, as a real
draft does on code or maths) alternating with held-out ones (it accepts less there), 17..242 tokens long. Each load
runs max(24, 8 x load) of them (reused in turn) x --max-new-tokens at temperature 0 (ignore EOS) with `load` requests in flight, after
a warm-up of `load` short requests; each row is measured twice and the slower pass is the row (both walls kept).

Phase 1: one server per setting, all started together, measured one at a time: NONE, DFLASH and DDTREE at the
--budgets (cap 8) and the chain (budget block - 1, cap 1, the block the pair's draft has: 7 for a block-8 draft,
15 for a block-16 one; DFlash's chain through DDTREE's pipeline, equal to SGLang's DFLASH
token for token on the GPU), each with and without the overlap scheduler; every server takes 48 running requests with
decode graphs up to 48.
Phase 2: the schedule this sweep finds - per load the fixed tree (budget, cap) with the most tokens/s, each from its
measured load on (found_schedule: the one finder, ddtree.settings.WidthSchedule.found, the sweep report's too); where every tree loses to DFLASH the chain can win, so the
schedule falls back to it there - served by DDTREE, with and without the overlap scheduler, measured the same way.
Beside each scheduled server phase 2 starts again the fixed servers of the trees it serves ("twins", same overlap
mode): at each load the twin of that load's tree and the scheduled server are measured in turn (twin, schedule,
twin, schedule), so that both run the same tree at the same minutes of the machine; the ratio is the schedule's own
cost (the first run's scheduled server was slower at 1 request than the fixed server of its width, measured
minutes apart). With --profile (the default) a profiled copy of each (the worker's step profiler) runs at 1 request
and its stage medians are printed side by side.

Split into jobs of one device call each (--phase): `fixed` with --modes off, then with --modes on (phase 1, each
mode's servers; NONE's answers saved for the later jobs), then `schedule` with --rows naming the earlier jobs'
results.json (phase 2); `all` (the default) runs both phases in one process. --schedule-off / --schedule-on measure
a given schedule instead of the one found (BUDGET or BUDGET/CAP, each a schedule: 1:32,3:16,40:7/1:8,40:1).
Writes OUT/results.json (every row), OUT/schedule.json (the schedule per overlap mode, whether it won at every load,
its cost beside its twins), OUT/table.md (tokens/s by load; ms before the first token / ms per decode step after it,
from SGLang's meta_info, so a per-request cost such as the prefill is told from the steps; the schedule beside its
twins, the stage profile, the issue's targets), OUT/tokens_per_s.png (tokens/s by load, per overlap mode),
OUT/none_outputs.json (NONE's answers by overlap mode and load), OUT/answers.json (every speculative row's answers, for testbed/speed_partings.py
to judge their partings from NONE's); prints the tables. The targets (targets()): the best DDTREE with the overlap scheduler
>= 1.5 x DFLASH with it at 1 request; DDTREE (the schedule with the overlap scheduler, the production candidate)
never below max(NONE, DFLASH) (each its faster overlap mode) at any load; step efficiency
tokens/s / (accept length x NONE tokens/s) >= 0.7 at 1 request.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench import sglang_e2e as e2e
from bench import trace_steps
from testbed import servers

from ddtree.settings import DDTreeConfigError, WidthSchedule, parse_schedule

LOADS = (1, 8, 16, 32, 48)
BUDGETS = (8, 16, 32, 64)
CAP = 8
CHAIN = (7, 1)      # budget block - 1, cap 1: DFlash's chain of a block-8 draft (chain_of: the pair's own)
MAX_BS = 48
OVERLAP = "-overlap"
TRACE_STEPS = 16    # --trace: decode steps in one trace (one request, after it started decoding)
TRACE_TOKENS = 512  # its answer: long enough to be decoding all through the profile
TRACE_KEEP_MB = 12  # a trace at most this large is kept beside its table


# --- prompts ----------------------------------------------------------------------------------------------

def mixed_prompts(heldout: list[list[int]], seen: list[list[int]], count: int) -> list[list[int]]:
    """`count` prompts alternating seen (training-file) and held-out ones, each file's prompts taken in turn and
    reused past its end, lengths 17..242 tokens cycling (prompt i cut to 1 + 16 + 15 x (i mod 16)); ValueError when
    a file holds none."""
    if not heldout or not seen:
        raise ValueError(f"mixed prompts need both kinds: the prompt files hold {len(seen)} seen and {len(heldout)} "
                         f"held-out (train_pair.py --prompts / --train-prompts)")
    out = []
    for i in range(count):
        source = seen if i % 2 == 0 else heldout
        out.append(source[(i // 2) % len(source)][: 1 + 16 + 15 * (i % 16)])
    return out


def prompts_per_load(load: int) -> int:
    """Requests per row: enough that a row takes seconds at every load (the first run's 2 x load took 0.5-1.5 s at
    8-48 running requests, and its two passes differed by up to 1.7x)."""
    return max(24, 8 * load)


# --- servers ----------------------------------------------------------------------------------------------

MODES = {"off": False, "on": True}     # --modes: the overlap scheduler off / on


def parse_modes(text: str) -> tuple[bool, ...]:
    """`off,on` -> (False, True); ValueError naming the value and the choices."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in words if w not in MODES]
    if not words or bad:
        raise ValueError(f"--modes {text!r} is invalid: expected off, on or off,on (the overlap scheduler's modes)")
    return tuple(dict.fromkeys(MODES[w] for w in words))


def chain_of(pair: Path) -> tuple[int, int]:
    """DFlash's chain through DDTREE for the pair's draft: (block - 1, 1), the block from the exported draft's
    config.json (ddtree.reference.export); ValueError naming the file when it has none."""
    path = pair / "draft" / "config.json"
    try:
        block = int(json.loads(path.read_text())["block_size"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} gives no block_size ({type(err).__name__}: {err}): --pair must be a pair exported by "
                         f"ddtree.reference.export") from None
    return block - 1, 1


def auto_name(budgets: tuple[int, ...]) -> str:
    """The width policy's server over these trees (cap 8): ddtree-auto_8_16_32-c8-graphs."""
    return f"ddtree-auto_{'_'.join(map(str, budgets))}-c{CAP}-graphs"


def fixed_configs(budgets=BUDGETS, modes: tuple[bool, ...] = (False, True),
                  chain: tuple[int, int] | None = CHAIN, auto: tuple[int, ...] = (),
                  caps: tuple[int, ...] = (CAP,), bases: tuple[str, ...] = ()) -> list[servers.ServerConfig]:
    """Phase 1: NONE, DFLASH, DDTREE at each budget x cap (cap 8 by default; a cap above the budget left out), the
    chain (None: without it) and, with `auto`, the width policy over those trees (issue 70), in each overlap mode of
    `modes`; `bases` (configuration names without the overlap and batch suffixes) replaces all of that."""
    if not bases:
        trees = [(b, c) for b in budgets for c in caps if c <= b] + ([chain] if chain else [])
        bases = ("none", "dflash", *(f"ddtree-b{b}-c{c}-graphs" for b, c in trees),
                 *([auto_name(auto)] if auto else []))
    return [servers.config(phase1_name(b, o)) for b in bases for o in modes]


def phase1_name(base: str, overlap: bool) -> str:
    """A phase-1 server's name: its configuration (as --configs names it) in an overlap mode, sized for 48 running."""
    return f"{base}{OVERLAP if overlap else ''}-bs48"


def fixed_name(tree: tuple[int, int], overlap: bool) -> str:
    return phase1_name(f"ddtree-b{tree[0]}-c{tree[1]}-graphs", overlap)


def schedule_label(schedule: WidthSchedule) -> str:
    """The bench's short form: the budget schedule alone where every cap is 8, else BUDGET/CAP."""
    return str(schedule.budget) if set(schedule.topk_cap.values) == {CAP} else f"{schedule.budget}/{schedule.topk_cap}"


def parse_tree_schedule(text: str, name: str) -> WidthSchedule:
    """`BUDGET` (cap 8) or `BUDGET/CAP`, each one value or a schedule; DDTreeConfigError names `name` and the value."""
    budget, _, cap = text.partition("/")
    try:
        return WidthSchedule(parse_schedule(budget, f"{name}'s budget"),
                             parse_schedule(cap or str(CAP), f"{name}'s cap"))
    except DDTreeConfigError as err:
        raise DDTreeConfigError(f"{name}={text} is invalid ({err}); expected BUDGET or BUDGET/CAP, each one value or a "
                                f"schedule, e.g. 1:32,40:7/1:8,40:1") from err


def found_name(overlap: bool) -> str:
    """The phase-2 server that serves the found (or given) schedule."""
    return f"ddtree-found{OVERLAP if overlap else ''}"


def scheduled_config(schedule: WidthSchedule, overlap: bool) -> servers.ServerConfig:
    """Phase 2: DDTREE serving `schedule` (budget and cap by running batch size)."""
    base = servers.config(fixed_name(max(schedule.trees), overlap))
    return replace(base, name=found_name(overlap), budget=str(schedule.budget),
                   cap=str(schedule.topk_cap))


TWIN = "twin-"      # phase 2's fixed servers: a name of their own, so that a fleet never takes them for phase 1's


def twin_configs(schedule: WidthSchedule, overlap: bool) -> list[servers.ServerConfig]:
    """The fixed server of each tree `schedule` serves (its overlap mode), started beside the scheduled one."""
    return [replace(servers.config(fixed_name(t, overlap)), name=TWIN + fixed_name(t, overlap))
            for t in schedule.trees]


def twin_at(schedule: WidthSchedule, load: int, overlap: bool) -> str:
    """The twin that runs the same tree as the scheduled server at `load` running requests."""
    return TWIN + fixed_name(schedule.at(load), overlap)


def profiled(cfg: servers.ServerConfig) -> servers.ServerConfig:
    """A copy of `cfg` with the worker's step profiler on (slower: its rows stay out of the speed table)."""
    return replace(servers.SUFFIXES[servers.PROFILE_SUFFIX](cfg), name=cfg.name + servers.PROFILE_SUFFIX)


def is_overlap(cfg_name: str) -> bool:
    return OVERLAP in cfg_name


# --- rows -------------------------------------------------------------------------------------------------

@dataclass
class SpeedRow:
    """One setting at one load: the slower of two passes."""

    config: str
    algorithm: str                  # NONE, DFLASH or DDTREE
    budget: int | str | None        # a schedule's text for the phase-2 servers
    overlap: bool
    load: int                       # requests in flight
    tokens_per_s: float
    accept_length: float | None     # SGLang's spec_accept_length, mean over requests
    tokens_per_step: float | None
    step_ms: float | None           # load 1 only
    equal_to_none: str | None       # against NONE (same overlap mode) at this load
    walls: list[float]              # both passes' seconds
    phase: str = "fixed"            # "fixed": phase 1; "schedule": a scheduled server or a twin measured with it
    cap: int | str | None = None    # DDTREE's top-k cap (a schedule's text); None in rows written before it was kept
    first_token_ms: float | None = None    # e2e.RequestSplit of the slower pass: queue + prefill before the 1st token
    decode_step_ms: float | None = None    # and each decode step after it (stalls by others' prefills included)
    forward_ms: float | None = None        # SGLang's decode-side forward device ms per request step (e2e.Row's)
    device_tokens_per_s: float | None = None   # decoded tokens / that device time: the speed if the host took none


def tree_of(row: SpeedRow) -> tuple[int, int]:
    """A fixed DDTREE row's tree (rows written before the cap was kept were all cap 8)."""
    return row.budget, row.cap if isinstance(row.cap, int) else CAP


def in_turn(servers_in_turn: list[servers.Server], prompts: list[list[int]], load: int, max_new_tokens: int,
            passes: int = 2) -> list[list[e2e.Measurement]]:
    """`passes` passes of every server, taken in turn (a b a b): what drifts on the machine over a row's minutes falls
    on each alike. One list of passes per server, in the order given."""
    runs: list[list[e2e.Measurement]] = [[] for _ in servers_in_turn]
    for _ in range(passes):
        for server, mine in zip(servers_in_turn, runs):
            mine.append(e2e.measure(server, prompts, load, 0.0, max_new_tokens))
    return runs


def slower_row(server: servers.Server, runs: list[e2e.Measurement], load: int,
               none_outputs: list[list[int]] | None, phase: str = "fixed") -> tuple[SpeedRow, list[list[int]]]:
    """The row of the slower pass, and its outputs (NONE's are the others' temperature-0 reference)."""
    slow = max(runs, key=lambda r: r.wall)
    r = e2e.summarize(server.config, load, 0.0, slow.answers, slow.wall, slow.latencies, none_outputs, slow.forward_s)
    row = SpeedRow(config=server.config.name, algorithm=r.algorithm, budget=server.config.budget,
                   overlap=server.config.overlap, load=load, tokens_per_s=r.tokens_per_s,
                   accept_length=r.accept_length, tokens_per_step=r.tokens_per_step, step_ms=r.step_ms,
                   equal_to_none=r.equal_to_none, walls=[round(x.wall, 4) for x in runs], phase=phase,
                   cap=server.config.cap, first_token_ms=r.first_token_ms, decode_step_ms=r.decode_step_ms,
                   forward_ms=r.forward_ms, device_tokens_per_s=r.device_tokens_per_s)
    return row, [a["output_ids"] for a in slow.answers]


def measure_row(server: servers.Server, prompts: list[list[int]], load: int, max_new_tokens: int,
                none_outputs: list[list[int]] | None) -> tuple[SpeedRow, list[list[int]]]:
    """The slower of two passes, and its outputs."""
    return slower_row(server, in_turn([server], prompts, load, max_new_tokens)[0], load, none_outputs)


def say_row(row: SpeedRow, how: str = "") -> None:
    print(f"{row.config} load {row.load}{how}: {row.tokens_per_s} tok/s, accept {row.accept_length}, "
          f"walls {row.walls}, equal to NONE {row.equal_to_none}, first token {row.first_token_ms} ms, "
          f"decode step {row.decode_step_ms} ms", flush=True)


def rows_from(paths: list[Path]) -> list[SpeedRow]:
    """The rows earlier jobs wrote (results.json), in order."""
    out = []
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"--rows {path} does not exist: name the results.json a `--phase fixed` job wrote")
        out += [SpeedRow(**r) for r in json.loads(path.read_text())]
    return out


def reference_key(overlap: bool, load: int) -> str:
    return f"{'on' if overlap else 'off'}-{load}"


def references_from(paths: list[Path]) -> dict[str, list[list[int]]]:
    """NONE's answers the earlier jobs saved beside their results.json (none_outputs.json), by mode and load."""
    out: dict[str, list[list[int]]] = {}
    for path in paths:
        saved = path.parent / NONE_ANSWERS
        if saved.is_file():
            out.update(json.loads(saved.read_text()))
    return out


# --- the schedule -----------------------------------------------------------------------------------------

def best_fixed(rows: list[SpeedRow], load: int, overlap: bool) -> SpeedRow:
    fixed = [r for r in rows if r.algorithm == "DDTREE" and isinstance(r.budget, int) and r.overlap == overlap
             and r.load == load and r.phase == "fixed"]
    if not fixed:
        raise ValueError(f"no fixed-budget DDTREE row at load {load} (overlap {overlap}) to choose from")
    return max(fixed, key=lambda r: r.tokens_per_s)


def found_schedule(rows: list[SpeedRow], loads: tuple[int, ...], overlap: bool) -> WidthSchedule:
    """Per load the fixed tree with the most tokens/s, found by the one rule (WidthSchedule.found: each from its
    load on, the lowest from 1)."""
    return WidthSchedule.found({load: tree_of(best_fixed(rows, load, overlap)) for load in loads})


def schedule_wins(rows: list[SpeedRow], scheduled: str, loads: tuple[int, ...], overlap: bool) -> dict[int, bool]:
    """Per load: the scheduled server at least as fast as every fixed tree of its overlap mode."""
    out = {}
    for load in loads:
        mine = [r for r in rows if r.config == scheduled and r.load == load]
        out[load] = bool(mine) and mine[0].tokens_per_s >= best_fixed(rows, load, overlap).tokens_per_s
    return out


@dataclass(frozen=True)
class ScheduleCost:
    """The scheduled server against its twin at one load, measured in turn."""

    load: int
    twin: str
    twin_row: SpeedRow
    schedule_row: SpeedRow

    @property
    def ratio(self) -> float:
        """schedule / twin tokens/s: below 1 what serving a schedule costs over the fixed server of the same tree."""
        return self.schedule_row.tokens_per_s / self.twin_row.tokens_per_s


def schedule_cost(rows: list[SpeedRow], scheduled: str, loads: tuple[int, ...]) -> list[ScheduleCost]:
    """Per load where both were measured in phase 2: the scheduled server and the twin measured in turn with it."""
    out = []
    for load in loads:
        mine = [r for r in rows if r.config == scheduled and r.load == load and r.phase == "schedule"]
        if not mine:
            continue
        twins = [r for r in rows if r.config.startswith(TWIN) and r.load == load and r.phase == "schedule"
                 and r.overlap == mine[0].overlap]
        if twins:
            out.append(ScheduleCost(load, twins[-1].config, twins[-1], mine[-1]))
    return out


# --- the targets ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    met: bool


def fastest(rows: list[SpeedRow], algorithm: str, load: int, overlap: bool | None = None) -> SpeedRow | None:
    sel = [r for r in rows if r.algorithm == algorithm and r.load == load and (overlap is None or r.overlap == overlap)]
    return max(sel, key=lambda r: r.tokens_per_s) if sel else None


def speedup_parts(tree: SpeedRow, dflash: SpeedRow) -> str:
    """DDTREE's speed-up over DFLASH at 1 request split in two: tokens per verify step (pooled over the requests;
    SGLang's accept length, a mean of per-request ratios, weighs long-accepting prompts more) and the time of a
    step. '' where a row lacks either."""
    if not (tree.tokens_per_step and dflash.tokens_per_step and tree.step_ms and dflash.step_ms):
        return ""
    return (f" (tokens per verify step {tree.tokens_per_step} / {dflash.tokens_per_step} = "
            f"{tree.tokens_per_step / dflash.tokens_per_step:.2f}x, step ms {tree.step_ms} / {dflash.step_ms} = "
            f"{tree.step_ms / dflash.step_ms:.2f}x)")


def spread(row: SpeedRow) -> float:
    """The row's pass-to-pass spread: (slower - faster) / slower of its two passes' walls."""
    return (max(row.walls) - min(row.walls)) / max(row.walls) if len(row.walls) > 1 and max(row.walls) > 0 else 0.0


def auto_targets(rows: list[SpeedRow], loads: tuple[int, ...]) -> list[Target]:
    """Issue 70's: the width policy's server >= max(NONE, DFLASH, the best fixed tree) at every load, in each overlap
    mode it ran, within the pass-to-pass spread (the larger of the two rows')."""
    out = []
    for name in dict.fromkeys(r.config for r in rows if "-auto" in r.config and r.phase == "fixed"):
        for load in loads:
            mine = [r for r in rows if r.config == name and r.load == load]
            if not mine:
                continue
            me = mine[0]
            rivals = [r for r in rows if r.load == load and r.overlap == me.overlap and r.phase == "fixed"
                      and (r.algorithm in ("NONE", "DFLASH") or isinstance(r.budget, int))]
            if not rivals:
                continue
            best = max(rivals, key=lambda r: r.tokens_per_s)
            margin = max(spread(me), spread(best))
            ratio = me.tokens_per_s / best.tokens_per_s
            out.append(Target(f"{name} >= max(NONE, DFLASH, best fixed tree) at {load} running requests",
                              f"{me.tokens_per_s} vs {best.config} {best.tokens_per_s} ({ratio:.3f}x; spread "
                              f"{margin:.1%})", ratio >= 1 - margin))
    return out


def targets(rows: list[SpeedRow], loads: tuple[int, ...], candidate: str) -> list[Target]:
    """Issue 45's three targets; `candidate` is the DDTREE setting held to the every-load one."""
    out = []
    tree, dflash = fastest(rows, "DDTREE", 1, overlap=True), fastest(rows, "DFLASH", 1, overlap=True)
    if tree and dflash:
        ratio = tree.tokens_per_s / dflash.tokens_per_s
        out.append(Target("DDTREE >= 1.5 x DFLASH at 1 request, overlap scheduler on both",
                          f"{tree.config} {tree.tokens_per_s} vs {dflash.config} {dflash.tokens_per_s} = {ratio:.2f}x"
                          + speedup_parts(tree, dflash), ratio >= 1.5))
    for load in loads:
        mine = [r for r in rows if r.config == candidate and r.load == load]
        rivals = [x for x in (fastest(rows, "NONE", load), fastest(rows, "DFLASH", load)) if x]
        if mine and rivals:
            best = max(rivals, key=lambda r: r.tokens_per_s)
            out.append(Target(f"{candidate} >= max(NONE, DFLASH) at {load} running requests",
                              f"{mine[0].tokens_per_s} vs {best.config} {best.tokens_per_s} "
                              f"({mine[0].tokens_per_s / best.tokens_per_s:.2f}x)",
                              mine[0].tokens_per_s >= best.tokens_per_s))
    none = fastest(rows, "NONE", 1)
    if tree and none and tree.accept_length:
        eff = tree.tokens_per_s / (tree.accept_length * none.tokens_per_s)
        out.append(Target("step efficiency tokens/s / (accept length x NONE tokens/s) >= 0.7 at 1 request",
                          f"{tree.config}: {tree.tokens_per_s} / ({tree.accept_length} x {none.tokens_per_s}) "
                          f"= {eff:.2f}", eff >= 0.7))
    return out


# --- tables -----------------------------------------------------------------------------------------------

def by_load(rows: list[SpeedRow], loads: tuple[int, ...], cell: Callable[[SpeedRow], str]) -> str:
    """One line per setting, one column per load: cell(row), blank where no row was measured."""
    names = list(dict.fromkeys(r.config for r in rows))
    out = ["| setting | " + " | ".join(f"{n} running" for n in loads) + " |", "|---|" + "---|" * len(loads)]
    for name in names:
        here: dict[int, SpeedRow] = {}
        for r in rows:
            if r.config == name:
                here.setdefault(r.load, r)                 # the first row of a setting at a load, as before
        out.append(f"| {name} | " + " | ".join(cell(here[n]) if n in here else "" for n in loads) + " |")
    return "\n".join(out)


def load_table(rows: list[SpeedRow], loads: tuple[int, ...]) -> str:
    """tokens/s (accept length) per setting by load."""
    return by_load(rows, loads, lambda r: f"{r.tokens_per_s}" + (f" ({r.accept_length})" if r.accept_length else ""))


def split_table(rows: list[SpeedRow], loads: tuple[int, ...]) -> str:
    """Per setting and load: ms before the first token / ms per decode step after it (SGLang's meta_info); empty
    when no row has them (rows written before they were kept, or a server without --enable-metrics)."""
    if not any(r.first_token_ms is not None for r in rows):
        return ""
    return by_load(rows, loads, lambda r: "" if r.first_token_ms is None else f"{r.first_token_ms} / {r.decode_step_ms}")


def target_table(found: list[Target]) -> str:
    return "\n".join(["| target | measured | met |", "|---|---|---|"]
                     + [f"| {t.what} | {t.measured} | {'yes' if t.met else '**no**'} |" for t in found])


def cost_table(costs: list[ScheduleCost]) -> str:
    """The schedule beside its twins: tokens/s (both passes' walls) and the ratio, per load."""
    out = ["| load | twin (the fixed server of the same tree) | twin tokens/s (walls s) | schedule tokens/s (walls s) "
           "| schedule / twin |", "|---|---|---|---|---|"]
    for c in costs:
        out.append(f"| {c.load} | {c.twin.removeprefix(TWIN)} | {c.twin_row.tokens_per_s} ({c.twin_row.walls}) | "
                   f"{c.schedule_row.tokens_per_s} ({c.schedule_row.walls}) | {c.ratio:.3f} |")
    return "\n".join(out)


def load_plot(rows: list[SpeedRow], loads: tuple[int, ...], path: Path):
    """tokens/s by running requests, one panel per overlap mode, one line per setting (twins and the profile left out);
    written to `path` (PNG). Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, overlap in zip(axes, (False, True)):
        shown = [r for r in rows if r.overlap == overlap and not r.config.startswith(TWIN)]
        for name in dict.fromkeys(r.config for r in shown):
            pts = sorted((r.load, r.tokens_per_s) for r in shown if r.config == name and r.load in loads)
            style = ":" if name.startswith("none") else "--" if name.startswith("dflash") else "-"
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", label=name.removesuffix("-bs48"))
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(loads), [str(x) for x in loads])
        ax.set_xlabel("running requests")
        ax.set_title(f"overlap scheduler {'on' if overlap else 'off'}")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("output tokens/s (slower of two passes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


# --- the run ----------------------------------------------------------------------------------------------

PHASES = ("all", "fixed", "schedule")
SCHEDULE_PORTS = 32000      # phase 2's fleets (one per overlap mode, 100 ports apart): never phase 1's ports


def save_rows(rows: list[SpeedRow], out: Path) -> None:
    (out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))


ANSWERS = "answers.json"      # every speculative setting's temperature-0 answers: {config: {load: [[ids]]}}
NONE_ANSWERS = "none_outputs.json"   # NONE's: {reference_key: [[ids]]}, the others' temperature-0 reference


def save_answers(out: Path, config: str, load: int, outputs: list[list[int]]) -> None:
    """A speculative row's answers (its slower pass) beside NONE's, so its partings from NONE can be judged
    afterwards (testbed/speed_partings.py) instead of only counted."""
    path = out / ANSWERS
    saved = json.loads(path.read_text()) if path.is_file() else {}
    saved.setdefault(config, {})[str(load)] = outputs
    path.write_text(json.dumps(saved))


def start_fleet(fleet: servers.Fleet, configs: list[servers.ServerConfig], timeout: float) -> dict[str, bool]:
    ready = fleet.start(configs, timeout=timeout)
    for name, ok in ready.items():
        if not ok:
            print(f"{name} did not start: {fleet.servers[name].exit_message()}", flush=True)
    return ready


def measure_fleet(fleet: servers.Fleet, configs: list[servers.ServerConfig], prompts: dict[int, list[list[int]]],
                  loads: tuple[int, ...], max_new_tokens: int, rows: list[SpeedRow], out: Path,
                  timeout: float, references: dict[str, list[list[int]]], one_at_a_time: bool = False,
                  traced: frozenset[str] = frozenset()) -> None:
    """Start `configs` together (with `one_at_a_time`: each alone, stopped after its rows - a pair whose one server
    fills the GPU, issue 69's enlarged pair), then measure them one at a time at every load (NONE's outputs, per
    overlap mode and load, go to `references` for the later rows' temperature-0 comparison); rows are appended and
    saved."""
    ready = {} if one_at_a_time else start_fleet(fleet, configs, timeout)
    for cfg in configs:
        if one_at_a_time:
            ready.update(start_fleet(fleet, [cfg], timeout))
        if ready.get(cfg.name):
            measure_config(fleet.servers[cfg.name], cfg, prompts, loads, max_new_tokens, rows, out, references)
            if cfg.name in traced:
                trace_config(fleet.servers[cfg.name], prompts[min(loads)][0], out / "traces")
        if one_at_a_time:
            fleet.stop(cfg.name)


def trace_config(server: servers.Server, prompt: list[int], outdir: Path) -> None:
    """One request's TRACE_STEPS decode steps under SGLang's torch profiler, taken once it decodes: bench/trace_steps.py's
    table in outdir/NAME.md, the trace itself (rank 0's) beside it when under TRACE_KEEP_MB (the profiler writes it to
    a fresh temporary folder first). A trace that fails, however, is said and the bench goes on."""
    name = server.config.name
    try:
        raw = Path(tempfile.mkdtemp(prefix=f"ddtree-trace-{name}-"))  # fresh: torch_trace returns any trace under it
        files = server.torch_trace(raw, prompt, servers.greedy(TRACE_TOKENS), TRACE_STEPS, decoding_after=0.5)
        rank0 = [f for f in files if "TP-0" in f.name] or files
        if not rank0:
            raise OSError("the profiler wrote no trace")
        text = trace_steps.table(trace_steps.summarize(trace_steps.read_events(rank0[0])), TRACE_STEPS)
    except Exception as err:           # a diagnostic: whatever fails, the bench's later servers still run
        print(f"{name}: no trace ({type(err).__name__}: {str(err)[:300]})", flush=True)
        return
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"{name}.md").write_text(text + "\n")
    if rank0[0].stat().st_size < TRACE_KEEP_MB * 1048576:
        shutil.copy(rank0[0], outdir / f"{name}-{rank0[0].name}")
    print(f"{name}, one request decoding:\n{text}", flush=True)


KEPT_METRICS = ("sglang:ddtree", "sglang:forward_execution_seconds_total")


def save_row_metrics(scrape: Callable[[], str], path: Path) -> None:
    """A server's sglang:ddtree_* lines and SGLang's forward device seconds by category (extend = prefill; decode,
    target verify, the draft's) after a row (`scrape`: its /metrics text) - cumulative: the width policy's steps per
    option, its cost corrections, the draft's calibration, where the device time went - so a row's choices and its
    prefill's share can be read beside its speed; a scrape that fails is said and skipped."""
    try:
        lines = [line for line in scrape().splitlines() if line.startswith(KEPT_METRICS)]
    except OSError as err:
        print(f"metrics of {path.stem} not read: {err}", flush=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def measure_config(server: servers.Server, cfg: servers.ServerConfig, prompts: dict[int, list[list[int]]],
                   loads: tuple[int, ...], max_new_tokens: int, rows: list[SpeedRow], out: Path,
                   references: dict[str, list[list[int]]]) -> None:
    """One started server at every load: its rows appended and saved as they come, its answers kept."""
    for load in loads:
        reference = None if cfg.algorithm == "NONE" else references.get(reference_key(cfg.overlap, load))
        try:
            row, outputs = measure_row(server, prompts[load], load, max_new_tokens, reference)
        except Exception as err:                  # a server that fails under load: its rows say so, others go on
            print(f"{cfg.name} at load {load}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        if cfg.algorithm == "NONE":
            references[reference_key(cfg.overlap, load)] = outputs
            (out / NONE_ANSWERS).write_text(json.dumps(references))
        else:
            save_answers(out, cfg.name, load, outputs)
        rows.append(row)
        say_row(row)
        save_rows(rows, out)
        save_row_metrics(server.metrics, out / "metrics" / f"{cfg.name}-{load}.prom")


def measure_schedule(fleet: servers.Fleet, schedule: WidthSchedule, overlap: bool, prompts: dict[int, list[list[int]]],
                     loads: tuple[int, ...], max_new_tokens: int, rows: list[SpeedRow], out: Path, timeout: float,
                     references: dict[str, list[list[int]]], profile: bool) -> list[e2e.ProfileRow]:
    """Phase 2 for one overlap mode: the scheduled server and its twins started together; at each load the twin of
    that load's tree and the scheduled server measured in turn (twin, schedule, twin, schedule), each its slower
    pass. With `profile`, profiled copies of the scheduled server and of its 1-request twin are driven at 1 request
    afterwards; their stage medians are returned."""
    sched = scheduled_config(schedule, overlap)
    twins = twin_configs(schedule, overlap)
    probes = [profiled(sched), profiled(next(t for t in twins if t.name == twin_at(schedule, 1, overlap)))] \
        if profile else []
    ready = start_fleet(fleet, [sched, *twins, *probes], timeout)
    for load in loads:
        names = [twin_at(schedule, load, overlap), sched.name]
        if not all(ready.get(n) for n in names):
            print(f"{sched.name} at load {load}: not measured ({' or '.join(n for n in names if not ready.get(n))} "
                  f"did not start)", flush=True)
            continue
        pair = [fleet.servers[n] for n in names]
        reference = references.get(reference_key(overlap, load))
        try:
            runs = in_turn(pair, prompts[load], load, max_new_tokens)
        except Exception as err:
            print(f"{sched.name} at load {load}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        for server, mine in zip(pair, runs):
            row, outputs = slower_row(server, mine, load, reference, phase="schedule")
            save_answers(out, row.config, load, outputs)
            rows.append(row)
            say_row(row, " (in turn)")
        save_rows(rows, out)
    found = []
    for cfg in probes:
        if ready.get(cfg.name):
            found += e2e.profile_rows(fleet.servers[cfg.name], prompts[min(loads)], [1], max_new_tokens)
    return found


def schedule_report(schedules: dict[bool, WidthSchedule], rows: list[SpeedRow], loads: tuple[int, ...]) -> dict:
    """Per overlap mode: the schedule, the server that serves it, where it won (measured rows only), its cost
    beside its twins."""
    report = {}
    for overlap, schedule in schedules.items():
        name = found_name(overlap)
        single = len(schedule.steps) == 1
        if single:       # one tree wins everywhere: the schedule is that fixed server
            name = fixed_name(schedule.steps[0][1], overlap)
        measured = any(r.config == name for r in rows)
        report["overlap" if overlap else "no overlap"] = {
            "schedule": schedule_label(schedule), "server": name, "one width": single, "measured": measured,
            "wins at": {str(k): v for k, v in schedule_wins(rows, name, loads, overlap).items()} if measured else {},
            "schedule / twin": {str(c.load): round(c.ratio, 3) for c in schedule_cost(rows, name, loads)}}
    return report


def given_schedules(args, modes: tuple[bool, ...]) -> dict[bool, WidthSchedule]:
    """--schedule-off / --schedule-on, parsed (DDTreeConfigError names the flag and the value)."""
    given = {}
    for overlap, text in ((False, args.schedule_off), (True, args.schedule_on)):
        if text and overlap in modes:
            given[overlap] = parse_tree_schedule(text, f"--schedule-{'on' if overlap else 'off'}")
    return given


@dataclass
class Run:
    """The command line as read and checked: the arguments, the loads, the overlap modes, the given schedules, the
    earlier jobs' results files, the pair's chain (budget, cap)."""

    args: argparse.Namespace
    loads: tuple[int, ...]
    modes: tuple[bool, ...]
    given: dict[bool, WidthSchedule]
    row_files: list[Path]
    chain: tuple[int, int]
    out: Path


def arguments(argv=None) -> Run:
    """The command line, each value checked (argparse's error names the flag and the value)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", required=True, help="the pair in SGLang's formats (target/, draft/)")
    ap.add_argument("--prompts", required=True, help="held-out prompts (JSON list of token-id lists)")
    ap.add_argument("--train-prompts", required=True, help="prompts from training files (train_pair.py --train-prompts)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--loads", default=",".join(map(str, LOADS)))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--phase", choices=PHASES, default="all",
                    help="fixed: phase 1 only; schedule: phase 2 only, from --rows; all: both (default)")
    ap.add_argument("--modes", default="off,on", help="the overlap scheduler's modes measured: off, on or off,on")
    ap.add_argument("--rows", default="", help="results.json files of earlier --phase fixed jobs, comma-separated")
    ap.add_argument("--schedule-off", default="",
                    help="measure this BUDGET[/CAP] schedule without the overlap scheduler")
    ap.add_argument("--schedule-on", default="", help="measure this BUDGET[/CAP] schedule with the overlap scheduler")
    ap.add_argument("--no-profile", action="store_true", help="phase 2 without the profiled servers")
    ap.add_argument("--trace", default="",
                    help="phase 1: after its rows, a torch-profiler trace of one request's decode steps of each of "
                         "these configurations (names as --configs), summarised by bench/trace_steps.py")
    ap.add_argument("--auto", default="",
                    help="phase 1 also serves the width policy over these trees (cap 8), e.g. 8,16,32 (issue 70)")
    ap.add_argument("--no-chain", action="store_true",
                    help="phase 1 without the chain (budget block - 1, cap 1: 7 for a block-8 draft)")
    ap.add_argument("--caps", default=str(CAP), help="phase 1's top-k caps for every budget, e.g. 1,4,8")
    ap.add_argument("--configs", default="",
                    help="phase 1 serves exactly these (names without the overlap and batch suffixes, e.g. "
                         "none,dflash,ddtree-b8-c4-graphs,dflash-k16) instead of the budgets x caps")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="phase 1 starts each server alone and stops it after its rows (a pair one server fills)")
    args = ap.parse_args(argv)
    loads = tuple(int(x) for x in args.loads.split(","))
    if max(loads) > MAX_BS or min(loads) < 1:
        ap.error(f"--loads {args.loads} is invalid: expected loads 1..{MAX_BS} (the servers' running requests)")
    try:
        modes = parse_modes(args.modes)
        given = given_schedules(args, modes)
    except (ValueError, DDTreeConfigError) as err:
        ap.error(str(err))
    row_files = [Path(x) for x in args.rows.split(",") if x]
    if args.phase == "schedule" and not row_files and set(given) != set(modes):
        ap.error(f"--phase schedule without --rows needs --schedule-off / --schedule-on for every mode of --modes "
                 f"{args.modes}: name the results.json of the --phase fixed jobs with --rows, or give the schedules")
    try:
        chain = chain_of(Path(args.pair))
    except ValueError as err:
        ap.error(str(err))
    return Run(args, loads, modes, given, row_files, chain, Path(args.out))


def phase_fixed(run: Run, prompts: dict[int, list[list[int]]], rows: list[SpeedRow], references: dict) -> None:
    """Phase 1: every fixed setting's rows (NONE first: the reference), the fleet stopped afterwards."""
    args = run.args
    fleet = servers.Fleet(Path(args.pair), run.out / "logs")
    try:
        configs = fixed_configs(tuple(int(b) for b in args.budgets.split(",")), run.modes,
                                None if args.no_chain else run.chain, tuple(int(b) for b in args.auto.split(",") if b),
                                tuple(int(c) for c in args.caps.split(",")),
                                tuple(c for c in args.configs.split(",") if c))
        traced = frozenset(phase1_name(b, o) for b in args.trace.split(",") if b for o in run.modes)
        measure_fleet(fleet, configs, prompts, run.loads, args.max_new_tokens, rows, run.out, args.start_timeout,
                      references, args.one_at_a_time, traced)
    finally:
        fleet.stop_all()


def phase_schedule(run: Run, prompts: dict[int, list[list[int]]], rows: list[SpeedRow],
                   references: dict) -> tuple[dict[bool, WidthSchedule], list[e2e.ProfileRow]]:
    """Phase 2: per overlap mode the given or found schedule, measured in turn with its twins where it has several
    widths (and only in the schedule or all phases); returns the schedules and the step profiles."""
    args = run.args
    schedules: dict[bool, WidthSchedule] = {}
    profiles: list[e2e.ProfileRow] = []
    for i, overlap in enumerate(run.modes):
        try:
            schedules[overlap] = run.given.get(overlap) or found_schedule(rows, run.loads, overlap)
        except ValueError as err:
            print(f"no schedule for overlap {overlap}: {err}", flush=True)
            continue
        print(f"{'given' if overlap in run.given else 'found'} schedule (overlap {overlap}): "
              f"{schedule_label(schedules[overlap])}", flush=True)
        if args.phase in ("all", "schedule") and len(schedules[overlap].steps) > 1:
            fleet = servers.Fleet(Path(args.pair), run.out / "logs", base_port=SCHEDULE_PORTS + 100 * i)
            try:
                profiles += measure_schedule(fleet, schedules[overlap], overlap, prompts, run.loads,
                                             args.max_new_tokens, rows, run.out, args.start_timeout, references,
                                             not args.no_profile)
            finally:
                fleet.stop_all()
    return schedules, profiles


def write_report(run: Run, rows: list[SpeedRow], schedules: dict[bool, WidthSchedule],
                 profiles: list[e2e.ProfileRow]) -> str:
    """results.json, schedule.json, table.md and tokens_per_s.png under OUT; returns the table's text."""
    out, loads = run.out, run.loads
    save_rows(rows, out)
    report = schedule_report(schedules, rows, loads)
    candidate = report.get("overlap", {}).get("server", found_name(True))
    found = targets(rows, loads, candidate) + auto_targets(rows, loads)
    (out / "schedule.json").write_text(json.dumps(report, indent=1))
    beside = {name: schedule_cost(rows, name, loads) for name in map(found_name, run.modes)}
    costs = "\n\n".join(f"{name} beside its twins (measured in turn):\n\n{cost_table(c)}"
                        for name, c in beside.items() if c)
    stages = f"step profile at 1 request (median ms host / total):\n\n{e2e.profile_table(profiles)}" if profiles else ""
    split = split_table(rows, loads)
    split = f"ms before the first token / ms per decode step after it (the same passes)\n\n{split}" if split else ""
    text = "\n\n".join(x for x in (
        f"tokens/s (accept length), temperature 0, the slower of two passes\n\n{load_table(rows, loads)}",
        split, costs, stages, f"schedules: {json.dumps(report)}", target_table(found)) if x) + "\n"
    (out / "table.md").write_text(text)
    try:
        load_plot(rows, loads, out / "tokens_per_s.png")
    except ImportError as err:             # the GPU test bed's bundles need not carry matplotlib: the table stands
        print(f"no tokens_per_s.png: {err} (the table and results.json are written)", flush=True)
    return text


def main(argv=None) -> int:
    run = arguments(argv)
    run.out.mkdir(parents=True, exist_ok=True)
    heldout, seen = (json.loads(Path(p).read_text()) for p in (run.args.prompts, run.args.train_prompts))
    prompts = {load: mixed_prompts(heldout, seen, prompts_per_load(load)) for load in run.loads}
    rows: list[SpeedRow] = rows_from(run.row_files)
    references = references_from(run.row_files)
    if run.args.phase in ("all", "fixed"):
        phase_fixed(run, prompts, rows, references)
    schedules, profiles = phase_schedule(run, prompts, rows, references)
    print(write_report(run, rows, schedules, profiles))
    return 0

if __name__ == "__main__":
    sys.exit(main())
