"""What each option's steps really take, learnt while the server runs (issue 70, item 2; plain Python, no SGLang).

The start-up table (graph_timing) replays each captured graph on its capture's inputs. On the rank-sized enlarged
pair (H100, 2026-12-07, docs/benchmarks.md) it priced a step at one request at 3.9 ms without speculation, 4.4 for
the chain and 5.8 for b32, while the server's steps took 5.7, 12.5 and 17.4: every width looked nearly free, the
policy (then pricing by the table plus one width-blind "host share") ran b32 at every load, and NONE was 1.8-2.4x
faster from 8 running requests up. So the table is only the prior here: every decode step's period (its start to the
next step's start, nothing else scheduled between) is credited to the step whose work it waited for, kept as the
ratio period / that step's table cost per option and batch band, and an option is priced at table x ratio.

  band(bs)                 the batch band: 1, 2-3, 4-7, 8-15, ... (bs.bit_length())
  MeasuredCosts.started    a step's start: the period since the previous start is credited `offset` steps back
  MeasuredCosts.ratio      the price's correction: measured at this band; else the option's nearest measured band's;
                           else the smallest any option has at this band (an option never run looks as cheap as the
                           cheapest one measured, so it is tried); else 1 (the table alone)
  MeasuredCosts.publish    the local ratios become the ones the policy prices with: rank 0's at TP > 1, through
                           `share` (every rank then prices, and so chooses, alike)
  MeasuredCosts.due        an option not run at this band for retry x (best score / its score) steps runs once to
                           be measured again (a clearly worse option seldom: retrying costs a step of it)

Without the overlap scheduler a step's period is its own (host, then device); with it, step k+1 is launched before
step k's tokens are read, so the time from step k's start to step k+1's is step k-1's device time when the device is
the bottleneck and the host's loop time when the host is: either way what an option costs at that load. The offset
is the policy's lag - 1 (0 without the overlap scheduler, 1 with it).

What it cannot see: a period that spans a prefill is no measurement (`interrupted`), so a cost paid per request (the
prefill, the draft's first pass) is in no option's price. On the enlarged pair with 48-token answers (H100, 2026-12-07
23:13) the periods priced trees below no speculation at every load while NONE's server was 1.8-2.6x faster from 8
running requests up: about 100 ms of each DFlash-family request lay outside its decode steps. A choice per step cannot
take that back; the sweep's choice of algorithm can.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

BANDS = 11                  # bands 1..11: batches up to 2047 (a batch past it shares the last band)


def band(bs: int) -> int:
    """The batch band of a running batch: 1 for 1, 2 for 2-3, 3 for 4-7, ... (at most BANDS)."""
    return min(max(int(bs), 1).bit_length(), BANDS)


@dataclass(frozen=True)
class Started:
    """One decode step as started: when, which option at which band, and its price then (table ms x ratio)."""

    at: float               # seconds (the policy's clock)
    option: int
    band: int
    table_ms: float
    priced_ms: float


@dataclass
class MeasuredCosts:
    """Each option's measured cost over its table cost, by batch band (module docstring)."""

    options: int
    offset: int = 0                   # the policy's lag - 1: 0 without the overlap scheduler, 1 with it
    learn: bool = True                # SGLANG_DDTREE_COST_LEARN: off prices by the table alone
    decay: float = 0.8                # weight of the old mean against one new period
    retry: int = 64                   # steps between two re-measurements of an option as good as the best
    gap_ms: float = 100.0             # a period this much past 5x the price is an idle gap, not a step
    local: dict[tuple[int, int], float] = field(default_factory=dict)     # (band, option) -> ratio, this rank's
    shared: dict[tuple[int, int], float] = field(default_factory=dict)    # what the policy prices with
    samples: dict[tuple[int, int], int] = field(default_factory=dict)
    last_run: dict[tuple[int, int], int] = field(default_factory=dict)    # (band, option) -> step it last ran
    history: deque = field(default_factory=deque)                          # the last offset + 1 steps started

    def __post_init__(self):
        if self.offset < 0:
            raise ValueError(f"offset={self.offset}: a period is credited to this step or one before it")

    # --- pricing ----------------------------------------------------------------------------------------------

    def ratio(self, b: int, option: int) -> float:
        """The correction an option's table cost gets at band `b` (module docstring: measured, nearest band's,
        the cheapest measured option's, 1)."""
        if not self.learn:
            return 1.0
        own = self.shared.get((b, option))
        if own is not None:
            return own
        bands = sorted((abs(other - b), other) for other, o in self.shared if o == option)
        if bands:
            return self.shared[(bands[0][1], option)]
        here = [r for (other, _), r in self.shared.items() if other == b]
        return min(here) if here else 1.0

    def priced(self, bs: int, table_ms: list[float]) -> list[float]:
        """Each option's price at a running batch of `bs`: its table ms x its ratio."""
        b = band(bs)
        return [ms * self.ratio(b, i) for i, ms in enumerate(table_ms)]

    def due(self, bs: int, step: int, scores: list[float], allowed: list[int]) -> int | None:
        """The option to re-measure this step instead of the best, if one is due: the allowed option whose time
        since it last ran at this band is the most past retry x (best score / its score); never run counts as
        due at once. None when none is due (or learning is off)."""
        if not self.learn or not allowed:
            return None
        b = band(bs)
        best = max(allowed, key=scores.__getitem__)
        most, pick = 1.0, None
        for i in allowed:
            if i == best:
                continue
            last = self.last_run.get((b, i))
            if last is None:
                return i
            wait = self.retry * scores[best] / max(scores[i], 1e-12)
            overdue = (step - last) / wait
            if overdue >= most:
                most, pick = overdue, i
        return pick

    # --- measuring --------------------------------------------------------------------------------------------

    def started(self, at: float, bs: int, option: int, table_ms: float, priced_ms: float, step: int) -> None:
        """A decode step starts at `at` (seconds): the period since the previous start is credited to the step
        `offset` before this one."""
        b = band(bs)
        self.last_run[(b, option)] = step
        if self.history:
            period_ms = (at - self.history[-1].at) * 1e3
            credited = self.history[-1 - self.offset] if len(self.history) > self.offset else None
            if credited is not None:
                self.record(credited, period_ms)
        self.history.append(Started(at, option, b, table_ms, priced_ms))
        while len(self.history) > self.offset + 1:
            self.history.popleft()

    def record(self, step: Started, period_ms: float) -> None:
        """One measured period of `step` into its (band, option) ratio; a clock that stood still (0) or an idle
        gap is no measurement."""
        if not self.learn or period_ms <= 0 or step.table_ms <= 0:
            return
        if period_ms > 5 * step.priced_ms + self.gap_ms:
            return
        key = (step.band, step.option)
        sample = period_ms / step.table_ms
        count = self.samples.get(key, 0)
        self.local[key] = sample if count == 0 else self.decay * self.local[key] + (1 - self.decay) * sample
        self.samples[key] = count + 1

    def interrupted(self) -> None:
        """A prefill or an idle step ran: the next period would include it (nothing is credited across it)."""
        self.history.clear()

    # --- every rank alike ---------------------------------------------------------------------------------------

    def vector(self) -> list[float]:
        """The local ratios as a flat list, band-major, NaN where none was measured (what `share` carries)."""
        return [self.local.get((b, i), math.nan) for b in range(1, BANDS + 1) for i in range(self.options)]

    def publish(self, share: Callable[[list[float]], list[float]] | None) -> None:
        """The ratios the policy prices with from now on: this rank's (share None: TP 1) or what `share` returns
        (rank 0's, at TP > 1)."""
        if share is None:
            self.shared = self.local           # TP 1: this rank's own, no copy a step
            return
        got = share(self.vector())
        if len(got) != BANDS * self.options:
            raise ValueError(f"the shared cost ratios hold {len(got)} values, expected {BANDS} bands x "
                             f"{self.options} options")
        self.shared = {(1 + k // self.options, k % self.options): float(v)
                       for k, v in enumerate(got) if not math.isnan(v)}
