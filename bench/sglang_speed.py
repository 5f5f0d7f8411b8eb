"""NONE, DFLASH and DDTREE with and without SGLang's overlap scheduler, and DDTREE with the budget schedule this
sweep finds, side by side inside the real SGLang 0.5.23 server at 1, 8, 16, 32 and 48 running requests (issue 45,
item 3; the GPU test bed).

Run on the GPU machine from the project root after staging, with a pair in SGLang's formats (bench/speed_sweep.sh
trains one, exports it and runs this):

    . .gpu-bundles/bin/env.sh
    python3 bench/sglang_speed.py --pair DIR --prompts heldout.json --train-prompts train.json --out OUT

Prompts: a mixed set - prompts cut from files the pair was trained on (its draft accepts long runs there, as a real
draft does on code or maths) alternating with held-out ones (it accepts less there), 17..242 tokens long. Each load
runs max(24, 8 x load) of them (reused in turn) x --max-new-tokens at temperature 0 (ignore EOS) with `load` requests in flight, after
a warm-up of `load` short requests; each row is measured twice and the slower pass is the row (both walls kept).

Phase 1: one server per setting, all started together, measured one at a time: NONE, DFLASH and DDTREE at the
--budgets (cap 8), each with and without the overlap scheduler; every server takes 48 running requests with decode
graphs up to 48.
Phase 2: the schedule this sweep finds - per load the fixed budget with the most tokens/s, switched at the geometric
middle between measured loads (found_schedule) - served by DDTREE with SGLANG_DDTREE_SCHEDULE=1, with and without the
overlap scheduler, measured the same way.
Writes OUT/results.json (every row), OUT/schedule.json (the schedule per overlap mode, whether it won at every load),
OUT/table.md (tokens/s by load, the issue's targets); prints the tables. The targets (targets()): the best DDTREE
with the overlap scheduler >= 1.5 x DFLASH with it at 1 request; DDTREE (the schedule with the overlap scheduler, the
production candidate) never below max(NONE, DFLASH) (each its faster overlap mode) at any load; step efficiency
tokens/s / (accept length x NONE tokens/s) >= 0.7 at 1 request.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_e2e as e2e  # noqa: E402
import sglang_servers as servers  # noqa: E402

from ddtree.settings import Schedule, parse_schedule  # noqa: E402

LOADS = (1, 8, 16, 32, 48)
BUDGETS = (8, 16, 32, 64)
CAP = 8
MAX_BS = 48
OVERLAP = "-overlap"
SCHEDULE_ENV = (("SGLANG_DDTREE_SCHEDULE", "1"),)


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

def fixed_configs(budgets=BUDGETS) -> list[servers.ServerConfig]:
    """Phase 1: NONE, DFLASH and DDTREE at each budget (cap 8), each with and without the overlap scheduler."""
    bases = ["none", "dflash", *(f"ddtree-b{b}-c{CAP}-graphs" for b in budgets)]
    return [servers.config(f"{b}{o}-bs48") for b in bases for o in ("", OVERLAP)]


def scheduled_config(schedule: Schedule, overlap: bool) -> servers.ServerConfig:
    """Phase 2: DDTREE serving `schedule` (budget by running batch size, cap 8)."""
    base = servers.config(f"ddtree-b{max(schedule.values)}-c{CAP}-graphs{OVERLAP if overlap else ''}-bs48")
    return replace(base, name=f"ddtree-found{OVERLAP if overlap else ''}", budget=str(schedule),
                   env=base.env + SCHEDULE_ENV)


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


def measure_row(server: servers.Server, prompts: list[list[int]], load: int, max_new_tokens: int,
                none_outputs: list[list[int]] | None) -> tuple[SpeedRow, list[list[int]]]:
    """The slower of two passes, and its outputs (NONE's are the others' temperature-0 reference)."""
    runs = [e2e.measure(server, prompts, load, 0.0, max_new_tokens) for _ in range(2)]
    slow = max(runs, key=lambda r: r.wall)
    r = e2e.summarize(server.config, load, 0.0, slow.answers, slow.wall, slow.latencies, none_outputs, slow.forward_s)
    row = SpeedRow(config=server.config.name, algorithm=r.algorithm, budget=server.config.budget,
                   overlap=server.config.overlap, load=load, tokens_per_s=r.tokens_per_s,
                   accept_length=r.accept_length, tokens_per_step=r.tokens_per_step, step_ms=r.step_ms,
                   equal_to_none=r.equal_to_none, walls=[round(x.wall, 4) for x in runs])
    return row, [a["output_ids"] for a in slow.answers]


# --- the schedule -----------------------------------------------------------------------------------------

def switch_points(loads: tuple[int, ...]) -> list[int]:
    """Where the schedule changes width between two measured loads: 1, then the (rounded-up) geometric middle of
    each neighbouring pair (8 and 16 -> 12)."""
    return [1] + [math.ceil(math.sqrt(a * b)) for a, b in zip(loads, loads[1:])]


def best_fixed(rows: list[SpeedRow], load: int, overlap: bool) -> SpeedRow:
    fixed = [r for r in rows if r.algorithm == "DDTREE" and isinstance(r.budget, int) and r.overlap == overlap
             and r.load == load]
    if not fixed:
        raise ValueError(f"no fixed-budget DDTREE row at load {load} (overlap {overlap}) to choose from")
    return max(fixed, key=lambda r: r.tokens_per_s)


def found_schedule(rows: list[SpeedRow], loads: tuple[int, ...], overlap: bool) -> Schedule:
    """Per load the fixed budget with the most tokens/s, from that load's switch point on; equal neighbours merged."""
    steps: list[tuple[int, int]] = []
    for start, load in zip(switch_points(loads), loads):
        budget = best_fixed(rows, load, overlap).budget
        if not steps or steps[-1][1] != budget:
            steps.append((start, budget))
    return parse_schedule(",".join(f"{b}:{v}" for b, v in steps), "found schedule")


def schedule_wins(rows: list[SpeedRow], scheduled: str, loads: tuple[int, ...], overlap: bool) -> dict[int, bool]:
    """Per load: the scheduled server at least as fast as every fixed budget of its overlap mode."""
    out = {}
    for load in loads:
        mine = [r for r in rows if r.config == scheduled and r.load == load]
        out[load] = bool(mine) and mine[0].tokens_per_s >= best_fixed(rows, load, overlap).tokens_per_s
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


def targets(rows: list[SpeedRow], loads: tuple[int, ...], candidate: str) -> list[Target]:
    """Issue 45's three targets; `candidate` is the DDTREE setting held to the every-load one."""
    out = []
    tree, dflash = fastest(rows, "DDTREE", 1, overlap=True), fastest(rows, "DFLASH", 1, overlap=True)
    if tree and dflash:
        ratio = tree.tokens_per_s / dflash.tokens_per_s
        out.append(Target("DDTREE >= 1.5 x DFLASH at 1 request, overlap scheduler on both",
                          f"{tree.config} {tree.tokens_per_s} vs {dflash.config} {dflash.tokens_per_s} = {ratio:.2f}x",
                          ratio >= 1.5))
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

def load_table(rows: list[SpeedRow], loads: tuple[int, ...]) -> str:
    """tokens/s (accept length) per setting by load."""
    names = list(dict.fromkeys(r.config for r in rows))
    out = ["| setting | " + " | ".join(f"{n} running" for n in loads) + " |", "|---|" + "---|" * len(loads)]
    for name in names:
        cells = []
        for load in loads:
            r = next((x for x in rows if x.config == name and x.load == load), None)
            cells.append("" if r is None else f"{r.tokens_per_s}" + (f" ({r.accept_length})" if r.accept_length else ""))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def target_table(found: list[Target]) -> str:
    return "\n".join(["| target | measured | met |", "|---|---|---|"]
                     + [f"| {t.what} | {t.measured} | {'yes' if t.met else '**no**'} |" for t in found])


# --- the run ----------------------------------------------------------------------------------------------

def measure_fleet(fleet: servers.Fleet, configs: list[servers.ServerConfig], prompts: dict[int, list[list[int]]],
                  loads: tuple[int, ...], max_new_tokens: int, rows: list[SpeedRow], out: Path,
                  timeout: float, references: dict[tuple[bool, int], list[list[int]]]) -> None:
    """Start `configs` together, then measure them one at a time at every load (NONE's outputs, per overlap mode
    and load, go to `references` for the later rows' temperature-0 comparison); rows are appended and saved."""
    ready = fleet.start(configs, timeout=timeout)
    for name, ok in ready.items():
        if not ok:
            print(f"{name} did not start: {fleet.servers[name].exit_message()}", flush=True)
    for cfg in configs:
        if not ready.get(cfg.name):
            continue
        server = fleet.servers[cfg.name]
        for load in loads:
            reference = None if cfg.algorithm == "NONE" else references.get((cfg.overlap, load))
            try:
                row, outputs = measure_row(server, prompts[load], load, max_new_tokens, reference)
            except Exception as err:                  # a server that fails under load: its rows say so, others go on
                print(f"{cfg.name} at load {load}: {type(err).__name__}: {str(err)[:300]}", flush=True)
                continue
            if cfg.algorithm == "NONE":
                references[(cfg.overlap, load)] = outputs
            rows.append(row)
            print(f"{row.config} load {load}: {row.tokens_per_s} tok/s, accept {row.accept_length}, "
                  f"walls {row.walls}, equal to NONE {row.equal_to_none}", flush=True)
            (out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", required=True, help="the pair in SGLang's formats (target/, draft/)")
    ap.add_argument("--prompts", required=True, help="held-out prompts (JSON list of token-id lists)")
    ap.add_argument("--train-prompts", required=True, help="prompts from training files (train_pair.py --train-prompts)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--loads", default=",".join(map(str, LOADS)))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--start-timeout", type=float, default=900)
    args = ap.parse_args(argv)
    loads = tuple(int(x) for x in args.loads.split(","))
    if max(loads) > MAX_BS or min(loads) < 1:
        ap.error(f"--loads {args.loads} is invalid: expected loads 1..{MAX_BS} (the servers' running requests)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    heldout, seen = (json.loads(Path(p).read_text()) for p in (args.prompts, args.train_prompts))
    prompts = {load: mixed_prompts(heldout, seen, prompts_per_load(load)) for load in loads}
    fleet = servers.Fleet(Path(args.pair), out / "logs")
    rows: list[SpeedRow] = []
    schedules: dict[bool, Schedule] = {}
    references: dict[tuple[bool, int], list[list[int]]] = {}
    try:
        phase1 = fixed_configs(tuple(int(b) for b in args.budgets.split(",")))     # NONE first: the reference
        measure_fleet(fleet, phase1, prompts, loads, args.max_new_tokens, rows, out, args.start_timeout, references)
        for s in list(fleet.servers.values()):
            s.stop()
        phase2 = []
        for overlap in (False, True):
            schedule = found_schedule(rows, loads, overlap)
            schedules[overlap] = schedule
            if len(schedule.steps) > 1:
                phase2.append(scheduled_config(schedule, overlap))
            print(f"found schedule (overlap {overlap}): {schedule}", flush=True)
        if phase2:
            measure_fleet(fleet, phase2, prompts, loads, args.max_new_tokens, rows, out, args.start_timeout,
                          references)
    finally:
        fleet.stop_all()
    report = {}
    for overlap, schedule in schedules.items():
        name = f"ddtree-found{OVERLAP if overlap else ''}"
        single = len(schedule.steps) == 1
        if single:       # one width wins everywhere: the schedule is that fixed server
            name = f"ddtree-b{schedule.steps[0][1]}-c{CAP}-graphs{OVERLAP if overlap else ''}-bs48"
        report["overlap" if overlap else "no overlap"] = {
            "schedule": str(schedule), "server": name, "one width": single,
            "wins at": {str(k): v for k, v in schedule_wins(rows, name, loads, overlap).items()}}
    candidate = report.get("overlap", {}).get("server", "ddtree-found-overlap")
    found = targets(rows, loads, candidate)
    (out / "schedule.json").write_text(json.dumps(report, indent=1))
    text = (f"tokens/s (accept length), temperature 0, the slower of two passes\n\n{load_table(rows, loads)}\n\n"
            f"schedules found: {json.dumps(report)}\n\n{target_table(found)}\n")
    (out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
