"""A DDTree budget / top-k cap schedule by running batch size, as a DDTREE server is sized and stepped by it
(issue 32; no SGLang import)."""

from __future__ import annotations

from dataclasses import dataclass

from ddtree.settings import SERVER_FLAGS, DDTreeSettings, Schedule, schedule_problems


@dataclass(frozen=True)
class WidthSchedule:
    """The budget and the top-k cap by running batch size (one step each for a plain value). The server is
    sized for the widest step (widest()); a decode step of b requests uses at(b)."""

    budget: Schedule
    topk_cap: Schedule

    def at(self, batch: int) -> tuple[int, int]:
        """(budget, cap) for a running batch of `batch` requests."""
        return self.budget.at(batch), self.topk_cap.at(batch)

    def widest(self, block_size: int | None = None) -> DDTreeSettings:
        return DDTreeSettings(max(self.budget.values), max(self.topk_cap.values), block_size)

    @property
    def stepped(self) -> bool:
        return len(self.budget.steps) > 1 or len(self.topk_cap.steps) > 1

    @property
    def widths(self) -> tuple[int, ...]:
        """The verify widths (budget + 1) the schedule can produce, ascending."""
        return tuple(sorted({b + 1 for b in self.budget.values}))

    def batches_at_width(self, width: int, max_bs: int) -> list[int]:
        """The running batch sizes 1..max_bs whose step verifies `width` tokens per request."""
        return [b for b in range(1, max_bs + 1) if self.budget.at(b) + 1 == width]

    def problems(self, block_size: int | None) -> list[str]:
        return schedule_problems(self.budget, self.topk_cap, block_size, SERVER_FLAGS)

    def __str__(self) -> str:
        return f"budget {self.budget} cap {self.topk_cap}"
