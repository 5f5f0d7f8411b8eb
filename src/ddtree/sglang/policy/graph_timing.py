"""What a step costs on the host the server runs on, measured at start-up (issue 70, item 1; imports SGLang's types
only through the runners it is given).

After the target's verify graphs exist (SGLang's at the widest width, widths.py's at each narrower one) and the
draft's graphs, every captured graph is replayed as captured, before the server reports ready, and timed with CUDA
events (the median of `replays` after `warmup` replays). The target's input-id buffer is first filled with random
token ids: with the capture's identical ids every token of an MoE would pick the same experts and the replay would
time a one-token expert read, not a tree's. The ids are drawn from the tokens the model embeds (rows of its embedding
that are not zero, `embedded_ids`): a token whose row is zero gives every layer the same input, so a replay of such
tokens reads one token's experts again. On the enlarged test pair (issue 69) 20,220 of its 20,480 ids are such rows
(the small pair's 260 tokens are the only live ones); its table drawn from every id (H100, 2026-12-07) priced a
33-token verify at 1.4x a one-token step where the rank's rig measured about 2.8x - not yet re-timed with the
embedded ids. The attention runs at the capture's short lengths, so the table is the
cost of a step's weights and experts, not of its context; the sweep's measured table can replace it
(SGLANG_DDTREE_COST_TABLE, a JSON file written by `CostTable.to_json`).

At TP > 1 every rank replays the same graphs in the same order (they hold the same collectives), and rank 0's table
is broadcast so that every rank's width policy chooses alike.

    table = time_graphs(target_runners, draft_runner, embedded_ids(embedding_weight, start, vocab), replays=5)
    table.verify_ms[(batch, width)], table.draft_ms[batch], table.step_ms(batch, width)
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ddtree.settings import DDTreeConfigError
from ddtree.width_policy import CostCurve

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapturedGraph:
    """One captured decode graph of a runner: the running batch it serves and its key in the runner's backend."""

    batch: int
    tokens: int        # rows it runs: batch x tokens per request
    key: object        # SGLang's ShapeKey


@dataclass
class CostTable:
    """Milliseconds of one replay of each captured graph: the target's verify at (batch, width), the draft's at
    batch. A step of the policy costs the draft's pass plus the verify of its width (step_ms); a step without
    speculation (width 1) the verify alone."""

    verify_ms: dict[tuple[int, int], float]
    draft_ms: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0                     # how long the timing took
    source: str = "start-up"                 # "start-up" or the file it was read from

    def step_ms(self, batch: int, width: int) -> float:
        return self.curve().at(batch, width)

    def curve(self) -> CostCurve:
        """The policy's cost curve: draft (the next timed batch up, 0 when no draft graph was timed) + verify; at
        width 1 (no speculation: the root alone, no draft pass) the verify alone."""
        draft = sorted(self.draft_ms)

        def draft_at(batch: int) -> float:
            up = [b for b in draft if b >= batch]
            return self.draft_ms[up[0]] if up else (self.draft_ms[draft[-1]] * batch / draft[-1] if draft else 0.0)

        return CostCurve({(b, w): ms + (draft_at(b) if w > 1 else 0.0) for (b, w), ms in self.verify_ms.items()})

    def widths(self) -> list[int]:
        return sorted({w for _, w in self.verify_ms})

    def lines(self) -> list[str]:
        """The table for the log: one line per width, ms by batch."""
        out = [f"DDTREE step cost, ms of one replay ({self.source}, timed in {self.seconds:.1f} s):"]
        if self.draft_ms:
            out.append("  draft    " + " ".join(f"bs{b}={ms:.3f}" for b, ms in sorted(self.draft_ms.items())))
        for width in self.widths():
            row = sorted((b, ms) for (b, w), ms in self.verify_ms.items() if w == width)
            out.append(f"  width {width:<3d}" + " ".join(f"bs{b}={ms:.3f}" for b, ms in row))
        return out

    def to_json(self) -> dict:
        return {"verify_ms": [[b, w, ms] for (b, w), ms in sorted(self.verify_ms.items())],
                "draft_ms": [[b, ms] for b, ms in sorted(self.draft_ms.items())],
                "seconds": self.seconds, "source": self.source}

    @classmethod
    def from_json(cls, data: Mapping, source: str) -> CostTable:
        try:
            verify = {(int(b), int(w)): float(ms) for b, w, ms in data["verify_ms"]}
            draft = {int(b): float(ms) for b, ms in data.get("draft_ms", [])}
        except (KeyError, TypeError, ValueError) as e:
            raise DDTreeConfigError(f"the cost table {source} is invalid ({e}): expected {{\"verify_ms\": [[batch, "
                                    "width, ms], ...], \"draft_ms\": [[batch, ms], ...]}} as CostTable.to_json "
                                    "writes") from None
        table = cls(verify, draft, float(data.get("seconds", 0.0)), source)
        try:
            table.curve()
        except ValueError as e:
            raise DDTreeConfigError(f"the cost table {source} is invalid: {e}") from None
        return table

    @classmethod
    def read(cls, path: Path) -> CostTable:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise DDTreeConfigError(f"SGLANG_DDTREE_COST_TABLE={path} cannot be read ({e}); point it at the JSON "
                                    "file a sweep wrote, or unset it to time the graphs at start-up") from None
        return cls.from_json(data, str(path))


def captured_graphs(runner) -> list[CapturedGraph]:
    """The graphs a SGLang 0.5.23 decode graph runner captured (its full CUDA-graph backend keeps them by ShapeKey),
    default variants only, ascending by batch."""
    graphs = getattr(getattr(runner, "backend", None), "_graphs", None)
    if graphs is None:
        raise DDTreeConfigError(f"the verify graphs cannot be timed: {type(runner).__name__}'s CUDA-graph backend "
                                f"{type(getattr(runner, 'backend', None)).__name__} keeps no graph table (SGLang "
                                "0.5.23's full backend does); give a measured table in SGLANG_DDTREE_COST_TABLE")
    per_request = int(getattr(runner, "captured_req_width", 1) or 1)
    ragged = bool(getattr(runner, "ragged_verify_mode", False))
    out = []
    for key in graphs:
        if getattr(key, "variant_label", None) is not None or getattr(key, "attention_variant", None) is not None:
            continue
        if getattr(key, "stream_idx", None) not in (None, 0):
            continue
        batch = key.size // per_request if ragged else key.size
        out.append(CapturedGraph(batch=batch, tokens=batch * per_request, key=key))
    return sorted(out, key=lambda g: g.batch)


def replay_ms(runner, graph: CapturedGraph, replays: int, warmup: int) -> float:
    """The median time of one replay of `graph`, CUDA events around each (one synchronisation at the end)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    with runner.model_context():
        for _ in range(warmup):
            runner.backend.replay(graph.key, None)
        for start, end in events:
            start.record()
            runner.backend.replay(graph.key, None)
            end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def embedded_ids(weight: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """The token ids [n] (int64, on the CPU) whose rows of an embedding shard are not all zero: `weight` [rows, hidden]
    holds the ids start .. start + count - 1 in its first `count` rows (the rest is padding). A shard with no such row
    (a rank of a vocabulary whose live tokens all sit on other ranks) gives all its ids: its lookups add zero, the
    other ranks' lookups still make the tokens differ."""
    if count < 1:
        raise ValueError(f"count={count}: an embedding shard holds at least one token")
    live = weight[:count].detach().abs().amax(dim=1).ne(0).nonzero().flatten().cpu()       # [n]
    ids = live if live.numel() else torch.arange(count)
    return ids.to(torch.int64) + int(start)


def random_ids(runner, tokens: int, pool: torch.Tensor, generator: torch.Generator) -> None:
    """The target graph's input ids [tokens] set to random tokens of `pool` [n] (so an MoE's tokens route apart)."""
    ids = runner.buffers.input_ids
    pick = torch.randint(0, pool.numel(), (tokens,), generator=generator, device="cpu")
    ids[:tokens].copy_(pool[pick].to(ids.device))


def time_runner(runner, replays: int, warmup: int, prepare=None) -> dict[int, float]:
    """ms of one replay by running batch, for every graph the runner captured."""
    out = {}
    for graph in captured_graphs(runner):
        if prepare is not None:
            prepare(graph)
        out[graph.batch] = replay_ms(runner, graph, replays, warmup)
    return out


def time_graphs(target_runners: Mapping[int, object], draft_runner, tokens: torch.Tensor, replays: int = 5,
                warmup: int = 2, seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> CostTable:
    """Every captured verify graph of `target_runners` (width -> its decode graph runner) and the draft runner's,
    timed: (warmup + replays) replays of each, a bound set by the graphs' count, not by a clock (at TP > 1 every
    rank must replay the same graphs: a clock could stop one rank's timing before another's). The verify graphs read
    random ids of `tokens` [n] (embedded_ids)."""
    if tokens.numel() < 1:
        raise ValueError("no token ids to time the verify graphs with")
    gen = torch.Generator().manual_seed(seed)
    tic = clock()
    verify: dict[tuple[int, int], float] = {}
    for width, runner in sorted(target_runners.items()):
        times = time_runner(runner, replays, warmup, prepare=lambda g, r=runner: random_ids(r, g.tokens, tokens, gen))
        verify.update({(b, width): ms for b, ms in times.items()})
    draft = time_runner(draft_runner, replays, warmup) if draft_runner is not None else {}
    return CostTable(verify, draft, clock() - tic, "start-up")


def shared_across_ranks(table: CostTable, tp_group, device) -> CostTable:
    """Rank 0's table on every rank (the same keys on every rank: each replayed the same graphs)."""
    if tp_group is None or int(getattr(tp_group, "world_size", 1)) <= 1:
        return table
    keys = sorted(table.verify_ms)
    draft_keys = sorted(table.draft_ms)
    values = torch.tensor([table.verify_ms[k] for k in keys] + [table.draft_ms[k] for k in draft_keys],
                          dtype=torch.float64, device=device)
    values = tp_group.broadcast(values, src=0)
    got = values.tolist()
    return CostTable(dict(zip(keys, got[:len(keys)])), dict(zip(draft_keys, got[len(keys):])), table.seconds,
                     table.source + " (rank 0's)")
