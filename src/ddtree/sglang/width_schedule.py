"""A DDTree budget / top-k cap schedule by running batch size, as a DDTREE server is sized and stepped by it
(issue 32; no SGLang import), or the set of widths the width policy chooses among each step (issue 70)."""

from __future__ import annotations

from dataclasses import dataclass

from ddtree.settings import SERVER_FLAGS, DDTreeSettings, Schedule, auto_problems, schedule_problems


@dataclass(frozen=True)
class WidthSchedule:
    """The budget and the top-k cap by running batch size (one step each for a plain value). The server is
    sized for the widest step (widest()); a decode step of b requests uses at(b).

    With `auto` (budgets the width policy chooses among) the budget schedule is the widest of them alone, and
    every step may run any of the trees or the chain (budget `chain`, cap 1: DFLASH's verify, width = the
    draft's block), at every running batch size."""

    budget: Schedule
    topk_cap: Schedule
    auto: tuple[int, ...] = ()      # the policy's tree budgets, ascending; () = the schedule decides
    chain: int | None = None        # the chain's budget (block - 1) when auto

    def at(self, batch: int) -> tuple[int, int]:
        """(budget, cap) for a running batch of `batch` requests (with auto: the widest tree's)."""
        return self.budget.at(batch), self.topk_cap.at(batch)

    def widest(self, block_size: int | None = None) -> DDTreeSettings:
        return DDTreeSettings(max(self.budget.values), max(self.topk_cap.values), block_size)

    @property
    def stepped(self) -> bool:
        return len(self.budget.steps) > 1 or len(self.topk_cap.steps) > 1

    def choices(self) -> tuple[tuple[int, int], ...]:
        """The (budget, cap) pairs a step of the width policy may run, narrowest first: the chain, then each tree
        (its cap at most its budget). () without auto."""
        if not self.auto:
            return ()
        cap = self.topk_cap.at(1)
        trees = [(b, min(cap, b)) for b in self.auto]
        chain = [(self.chain, 1)] if self.chain is not None else []
        return tuple(sorted(set(chain + trees), key=lambda p: (p[0] + 1, p[1])))

    def pairs(self, max_bs: int) -> set[tuple[int, int]]:
        """Every (budget, cap) some step of this server may run (one tree each is built at start-up)."""
        if self.auto:
            return set(self.choices())
        return {self.at(b) for b in range(1, max_bs + 1)}

    @property
    def widths(self) -> tuple[int, ...]:
        """The verify widths (budget + 1) the schedule can produce, ascending."""
        if self.auto:
            return tuple(sorted({b + 1 for b, _ in self.choices()}))
        return tuple(sorted({b + 1 for b in self.budget.values}))

    def batches_at_width(self, width: int, max_bs: int) -> list[int]:
        """The running batch sizes 1..max_bs whose step verifies `width` tokens per request (with auto: every
        size, at each of its widths)."""
        if self.auto:
            return list(range(1, max_bs + 1)) if width in self.widths else []
        return [b for b in range(1, max_bs + 1) if self.budget.at(b) + 1 == width]

    def problems(self, block_size: int | None) -> list[str]:
        if self.auto:
            return auto_problems(self.auto, self.topk_cap, block_size, SERVER_FLAGS)
        return schedule_problems(self.budget, self.topk_cap, block_size, SERVER_FLAGS)

    def __str__(self) -> str:
        if self.auto:
            return f"budget auto:{','.join(map(str, self.auto))} (and the chain) cap {self.topk_cap}"
        return f"budget {self.budget} cap {self.topk_cap}"
