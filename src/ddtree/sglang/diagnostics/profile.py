"""Per-stage timing of the DDTREE decode step, for measurement only (off unless asked for).

`SGLANG_DDTREE_PROFILE_STEPS=N` (N > 0) turns it on in the worker: every stage of every decode
step is timed twice,
  host   until the stage's Python returns (its kernels queued, not necessarily run), and
  total  after a device synchronisation at the stage's end (the stage's cost when nothing
         overlaps it),
plus `between`: from the end of one decode step to the start of the next (the scheduler's own
work; a prefill or an idle gap in between is not a decode gap and is left out). Every N steps of
one batch size the worker logs one line of medians:

    DDTREE step profile bs=1 steps=200 (median ms host/total): between 0.90/0.90 window 0.05/0.06 ...

The synchronisations serialise what CUDA would overlap, so a profiled server is slower than an
unprofiled one: measure tokens/s with profiling off and read the breakdown from its own server.
"""

from __future__ import annotations

import contextlib
import logging
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ddtree import switches

ENV_PROFILE_STEPS = switches.NAME["profile_steps"]
LINE = re.compile(r"DDTREE step profile bs=(\d+) steps=(\d+) \(median ms host/total\): (.*)")
STAGE = re.compile(r"(\w+) ([\d.]+)/([\d.]+)")
GAP_LIMIT_S = 0.05     # a gap longer than this between two decode steps is not the scheduler's step overhead

logger = logging.getLogger(__name__)


@dataclass
class StageTimes:
    host: list[float] = field(default_factory=list)    # seconds
    total: list[float] = field(default_factory=list)   # seconds


@dataclass
class StepProfile:
    """One logged line: medians in milliseconds per stage (host, total), in stage order."""

    batch_size: int
    steps: int
    stages: dict[str, tuple[float, float]]

    def line(self) -> str:
        parts = " ".join(f"{name} {h:.3f}/{t:.3f}" for name, (h, t) in self.stages.items())
        return f"DDTREE step profile bs={self.batch_size} steps={self.steps} (median ms host/total): {parts}"


def parse_profile_lines(text: str) -> list[StepProfile]:
    """Every profile line in a server log, in order (the inverse of StepProfile.line)."""
    out = []
    for m in LINE.finditer(text):
        stages = {name: (float(h), float(t)) for name, h, t in STAGE.findall(m.group(3))}
        out.append(StepProfile(batch_size=int(m.group(1)), steps=int(m.group(2)), stages=stages))
    return out


class StepProfiler:
    """Times the stages of decode steps; `every` steps per batch size make one StepProfile."""

    def __init__(self, every: int, sync: Callable[[], None], clock: Callable[[], float] = time.perf_counter,
                 emit: Callable[[StepProfile], None] | None = None):
        if every < 1:
            raise ValueError(f"{ENV_PROFILE_STEPS}={every} is invalid: expected a positive number of steps")
        self.every, self.sync, self.clock = every, sync, clock
        self.emit = emit or (lambda p: logger.info("%s", p.line()))
        self._times: dict[int, dict[str, StageTimes]] = defaultdict(lambda: defaultdict(StageTimes))
        self._steps: dict[int, int] = defaultdict(int)
        self._bs = 0
        self._step_start = 0.0
        self._last_end: float | None = None

    @classmethod
    def from_switches(cls, read: switches.Switches, sync: Callable[[], None]) -> StepProfiler | None:
        """SGLANG_DDTREE_PROFILE_STEPS: steps per logged line, unset or 0 for off."""
        return cls(read.profile_steps, sync) if read.profile_steps else None

    def begin(self, batch_size: int) -> None:
        self.sync()
        now = self.clock()
        self._bs, self._step_start = batch_size, now
        if self._last_end is not None and now - self._last_end < GAP_LIMIT_S:
            gap = now - self._last_end
            self._record("between", gap, gap)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = self.clock()
        yield
        host = self.clock() - start
        self.sync()
        self._record(name, host, self.clock() - start)

    def end(self) -> None:
        self.sync()
        now = self.clock()
        self._record("step", now - self._step_start, now - self._step_start)
        self._last_end = now
        self._steps[self._bs] += 1
        if self._steps[self._bs] % self.every == 0:
            self.emit(self._summary(self._bs))
            self._times.pop(self._bs)

    def _record(self, name: str, host: float, total: float) -> None:
        times = self._times[self._bs][name]
        times.host.append(host)
        times.total.append(total)

    def _summary(self, bs: int) -> StepProfile:
        stages = {name: (1000 * statistics.median(t.host), 1000 * statistics.median(t.total))
                  for name, t in self._times[bs].items()}
        return StepProfile(batch_size=bs, steps=self.every, stages=stages)


class _Off:
    """What the worker holds when profiling is off: every call is a no-op."""

    _null = contextlib.nullcontext()

    def begin(self, batch_size: int) -> None:
        pass

    def stage(self, name: str):
        return self._null

    def end(self) -> None:
        pass


OFF = _Off()
