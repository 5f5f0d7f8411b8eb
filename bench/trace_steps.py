"""Where a server's decode steps spend GPU time, from SGLang's own torch-profiler trace (Server.torch_trace).

Issue 70's start-up table timed each verify graph replayed alone at 3.9-5.6 ms at one request on the enlarged pair,
while the served steps took 5.7 (NONE) to 17.4 ms (b32): either the served step's kernels take longer than the
replay's (its inputs route or attend differently) or the GPU waits between them (host work not hidden). One trace
of N steps answers it: the kernels' summed time against the span they cover, and which kernels take it. Where the
trace holds Python's calls (SGLang's profiler records them), the host's side too: the busiest Python thread's (the
scheduler's) self time per step by package - sglang's by its first two folders, ddtree, torch, triton, and Python's
built-in calls (a graph replay's launch among them) - so a step whose GPU idles can be laid to the code that ran.

    python3 -m bench.trace_steps TRACE.json[.gz] [--steps 16]     a table on stdout
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DIGITS = re.compile(r"\d+")
GRAPH_LAUNCH = "cudaGraphLaunch"


@dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    dur_us: float


@dataclass
class KernelGroup:
    name: str                 # the kernel's name, template arguments and digits folded
    count: int = 0
    total_us: float = 0.0


@dataclass(frozen=True)
class HostGroup:
    name: str                 # a package (module_of)
    self_us: float            # time in its own functions, its callees' left out


@dataclass(frozen=True)
class TraceSummary:
    kernels: int
    busy_us: float            # the union of the kernels' intervals (streams overlapping counted once)
    span_us: float            # first kernel's start to last kernel's end
    graph_launches: int
    groups: list[KernelGroup]
    host: tuple[HostGroup, ...] = ()  # the scheduler thread's self time by package, the largest first; () without Python

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us


def read_events(path: Path) -> list[dict]:
    """The trace's events ([] when it holds none); a .gz trace is read compressed."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else data


def kernels_of(events: list[dict]) -> list[Kernel]:
    """The GPU kernels (complete events of category kernel), by start."""
    out = [Kernel(e.get("name", "?"), float(e["ts"]), float(e.get("dur", 0.0)))
           for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    return sorted(out, key=lambda k: k.start_us)


def busy_us(kernels: list[Kernel]) -> float:
    """The union of the kernels' intervals [start, start + dur) (sorted by start)."""
    total, end = 0.0, float("-inf")
    for k in kernels:
        stop = k.start_us + k.dur_us
        if stop <= end:
            continue
        total += stop - max(k.start_us, end)
        end = stop
    return total


def group_name(kernel: str) -> str:
    """A kernel's name without template arguments or digits, cut to 60 characters, so instantiations group."""
    base = kernel.split("<", 1)[0].split("(", 1)[0]
    return DIGITS.sub("#", base).strip()[:60] or kernel[:60]


def grouped(kernels: list[Kernel]) -> list[KernelGroup]:
    """Kernel time by group, the largest first."""
    groups: dict[str, KernelGroup] = {}
    for k in kernels:
        name = group_name(k.name)
        g = groups.setdefault(name, KernelGroup(name))
        g.count += 1
        g.total_us += k.dur_us
    return sorted(groups.values(), key=lambda g: -g.total_us)


def module_of(function: str) -> str:
    """The package a profiled Python function belongs to: "sglang/srt/managers/scheduler.py(2078): run" -> sglang/srt/
    managers; "ddtree/sglang/step/decode_step.py(155): f" -> ddtree/sglang; "<built-in method ...>" -> built-in calls;
    a file at the top ("contextlib.py(132): __enter__") -> contextlib.py."""
    if function.startswith("<"):
        return "built-in calls"
    parts = function.split("(", 1)[0].split("/")
    if parts[0] == "sglang":
        return "/".join(parts[:3])
    if parts[0] == "ddtree":
        return "/".join(parts[:2])
    return parts[0]


def python_calls(events: list[dict]) -> list[dict]:
    """The busiest thread's Python calls (SGLang's scheduler, in a trace of its process), by start, the longer first
    among calls that start together (a caller before its callee)."""
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"]
    if not calls:
        return []
    busiest = Counter(e.get("tid") for e in calls).most_common(1)[0][0]
    return sorted((e for e in calls if e.get("tid") == busiest), key=lambda e: (float(e["ts"]), -float(e["dur"])))


def host_groups(calls: list[dict]) -> tuple[HostGroup, ...]:
    """Self time (a call's duration less its direct callees') summed by package, the largest first; calls nest by
    their intervals on one thread."""
    totals: dict[str, float] = {}
    stack: list[tuple[str, float]] = []                 # (package, end) of the open calls
    for e in calls:
        start, dur = float(e["ts"]), float(e["dur"])
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            totals[stack[-1][0]] -= dur                 # the caller's own time excludes this call
        name = module_of(e.get("name", "?"))
        totals[name] = totals.get(name, 0.0) + dur
        stack.append((name, start + dur))
    return tuple(sorted((HostGroup(n, t) for n, t in totals.items()), key=lambda g: -g.self_us))


def summarize(events: list[dict]) -> TraceSummary:
    kernels = kernels_of(events)
    if not kernels:
        raise ValueError("the trace holds no GPU kernel events: was it taken with activities CPU and GPU?")
    span = max(k.start_us + k.dur_us for k in kernels) - kernels[0].start_us
    launches = sum(1 for e in events if e.get("ph") == "X" and e.get("name") == GRAPH_LAUNCH)
    return TraceSummary(len(kernels), busy_us(kernels), span, launches, grouped(kernels),
                        host_groups(python_calls(events)))


def table(summary: TraceSummary, steps: int, top: int = 12) -> str:
    """Per step: GPU busy, idle and span in ms, then the top kernel groups' ms per step."""
    per = max(steps, 1) * 1000.0
    head = [f"steps {steps}, kernels {summary.kernels}, graph launches {summary.graph_launches}", "",
            "| per step | ms |", "|---|---|",
            f"| GPU busy (kernels' union) | {summary.busy_us / per:.3f} |",
            f"| GPU idle between kernels | {summary.idle_us / per:.3f} |",
            f"| span | {summary.span_us / per:.3f} |", "",
            "| kernel group | calls per step | ms per step | share of busy |", "|---|---|---|---|"]
    rows = [f"| {g.name} | {g.count / max(steps, 1):.1f} | {g.total_us / per:.3f} | "
            f"{g.total_us / max(summary.busy_us, 1e-9):.1%} |" for g in summary.groups[:top]]
    if summary.host:
        total = sum(g.self_us for g in summary.host)
        rows += ["", f"host: the scheduler thread's Python self time, {total / per:.3f} ms per step (the profiler's own "
                 "cost included)", "", "| package | ms per step |", "|---|---|"]
        rows += [f"| {g.name} | {g.self_us / per:.3f} |" for g in summary.host[:top]]
    return "\n".join(head + rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a torch-profiler trace (.json or .json.gz)")
    ap.add_argument("--steps", type=int, default=16, help="decode steps the trace holds (the profile's num_steps)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    path = Path(args.trace)
    if args.steps < 1:
        ap.error(f"--steps {args.steps} is invalid: the trace holds at least one step")
    try:
        summary = summarize(read_events(path))
    except (OSError, ValueError) as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 1
    print(table(summary, args.steps, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
