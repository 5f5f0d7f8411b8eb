"""The DDTree settings of a server or an engine: one object, its ranges and its messages.

budget (draft-tree nodes verified per step, width budget + 1 with the root), topk_cap (candidates
per depth) and the draft's block size (the bonus slot + L = block - 1 depths). The SGLang plugin
(`ddtree.sglang.setup.refusals`), the reference server's CLI (`ddtree.serve.cli`) and the reference
engine (`ddtree.reference.engine`) check their values here; the deployment's preflight checks the
same ranges before any change (`roles/preflight/vars/main.yml` holds the same limits, and
`tests/ansible/test_static.py` checks that they agree with this module).

Every message names the setting as its caller spells it (a flag, an Ansible variable or a Python
argument), the value, and what is allowed. Plain Python: no torch, no SGLang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_BUDGET = 32       # the tested defaults (docs/benchmarks.md)
DEFAULT_TOPK_CAP = 8
SCHEDULE_TEXT = re.compile(r"[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*")
MAX_BUDGET = 1023         # the verify width budget + 1 stays within 1024 tokens per request
AUTO_BUDGETS = (8, 16, 32)  # the trees `auto` chooses among, beside the chain (docs/cost-model.md: on Kimi's rank a
                            # wider tree costs more than it earns at every load the rig measured)
AUTO_TEXT = re.compile(r"auto(:[0-9]+(,[0-9]+)*)?")


class DDTreeConfigError(ValueError):
    """A DDTree setting that cannot work; the message names the setting, its value and the fix."""


@dataclass(frozen=True)
class SettingNames:
    """How a caller spells the three settings in its messages."""

    budget: str = "budget"
    topk_cap: str = "topk_cap"
    block_size: str = "block_size"


PYTHON_NAMES = SettingNames()
SERVER_FLAGS = SettingNames("--speculative-ddtree-budget", "--speculative-ddtree-topk-cap",
                            "--speculative-dflash-block-size")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DDTreeSettings:
    budget: int = DEFAULT_BUDGET      # draft-tree nodes verified per step
    topk_cap: int = DEFAULT_TOPK_CAP  # candidates per depth
    block_size: int | None = None     # the draft's block; None = not known (the block rule is skipped)

    @property
    def verify_tokens(self) -> int:
        """Tokens per request in a target-verify pass (and its CUDA graphs): budget + 1."""
        return self.budget + 1

    def problems(self, names: SettingNames = PYTHON_NAMES, cap_within_budget: bool = True) -> list[str]:
        """Every range the settings break, in the order budget, cap, block; [] when they are good.

        cap_within_budget=False accepts a top-k cap above the budget (the engine keeps
        min(cap, budget, V) candidates per depth anyway); a server's flags are held to cap <= budget.
        """
        out = []
        if not _is_int(self.budget) or not 1 <= self.budget <= MAX_BUDGET:
            out.append(f"{names.budget}={self.budget!r} is invalid: expected 1..{MAX_BUDGET} "
                       f"({DEFAULT_BUDGET} is the tested default)")
            return out                                  # the other rules are read against the budget
        top = self.budget if cap_within_budget else None
        if not _is_int(self.topk_cap) or self.topk_cap < 1 or (top is not None and self.topk_cap > top):
            allowed = f"1..budget ({self.budget})" if top is not None else "an integer >= 1"
            out.append(f"{names.topk_cap}={self.topk_cap!r} is invalid: expected {allowed}; "
                       f"{DEFAULT_TOPK_CAP} is the tested default")
        out.extend(self._block_problems(names))
        return out

    def _block_problems(self, names: SettingNames) -> list[str]:
        block = self.block_size
        if block is None:
            return []
        if not _is_int(block) or block < 2:
            return [f"{names.block_size}={block!r} is invalid: a DFlash block holds the bonus token and >= 1 depth"]
        if self.verify_tokens < block:
            return [f"{names.budget}={self.budget} is invalid with block size {block}: the draft's block must fit "
                    f"in the verify window (budget + 1 >= block size); use a budget >= {block - 1} "
                    f"({block - 1} with {names.topk_cap} 1 is the DFlash chain)"]
        return []

    def check(self, names: SettingNames = PYTHON_NAMES, cap_within_budget: bool = True) -> DDTreeSettings:
        """These settings, or DDTreeConfigError with the first problem."""
        for message in self.problems(names, cap_within_budget):
            raise DDTreeConfigError(message)
        return self


# --- a width by running batch size (issue 32) ---------------------------------------------------

@dataclass(frozen=True)
class Schedule:
    """A value by running batch size: `steps` ((from_batch, value), ...) with from_batch 1 first and
    increasing; a batch of b requests takes the value of the last step whose from_batch <= b.
    Written `1:64,8:32,32:8`; a plain `32` is the one-step schedule `1:32`."""

    steps: tuple[tuple[int, int], ...]

    def at(self, batch: int) -> int:
        """The value for a running batch of `batch` requests (>= 1)."""
        value = self.steps[0][1]
        for start, v in self.steps:
            if start > batch:
                break
            value = v
        return value

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(sorted({v for _, v in self.steps}))

    def __str__(self) -> str:
        return str(self.steps[0][1]) if len(self.steps) == 1 else ",".join(f"{b}:{v}" for b, v in self.steps)


def parse_schedule(text: str | int, name: str, maximum: int = MAX_BUDGET) -> Schedule:
    """`32` or `1:64,8:32,32:8` -> Schedule; DDTreeConfigError naming `name`, the value and the rule."""
    raw = str(text).strip()
    shown = raw or "''"
    fix = (f"expected one integer 1..{maximum} or BATCH:VALUE pairs by running batch size, the first at batch 1 "
           f"and the batches increasing, e.g. 1:64,8:32,32:8")
    if raw.isdigit():
        steps = ((1, int(raw)),)
    elif SCHEDULE_TEXT.fullmatch(raw):                                  # digits, ':' and ',' only (as preflight)
        steps = tuple((int(b), int(v)) for b, v in (part.split(":") for part in raw.split(",")))
    else:
        raise DDTreeConfigError(f"{name}={shown} is invalid: {fix}")
    if not steps or steps[0][0] != 1 or any(b2 <= b1 for (b1, _), (b2, _) in zip(steps, steps[1:])):
        raise DDTreeConfigError(f"{name}={shown} is invalid: {fix}")
    bad = [v for _, v in steps if not 1 <= v <= maximum]
    if bad:
        raise DDTreeConfigError(f"{name}={shown} is invalid: {bad[0]} is outside 1..{maximum}; {fix}")
    return Schedule(steps)


def schedule_batches(*schedules: Schedule) -> list[int]:
    """The batch sizes where any of the schedules changes, ascending (1 first)."""
    return sorted({b for schedule in schedules for b, _ in schedule.steps})


def schedule_problems(budget: Schedule, topk_cap: Schedule, block_size: int | None,
                      names: SettingNames = PYTHON_NAMES) -> list[str]:
    """The single-value rules at every batch size where either schedule changes (cap <= budget, the
    block fits the verify window), each message naming the batch size."""
    out = []
    for batch in schedule_batches(budget, topk_cap):
        for message in DDTreeSettings(budget.at(batch), topk_cap.at(batch), block_size).problems(names):
            out.append(f"from batch size {batch}: {message}")
    return out


# --- the width chosen each step (issue 70) ------------------------------------------------------

def is_auto(text: str | int) -> bool:
    """Whether a budget's text asks for the width policy (`auto` or `auto:8,16,32`)."""
    return str(text).strip().lower().startswith("auto")


def parse_auto(text: str, name: str, maximum: int = MAX_BUDGET) -> tuple[int, ...]:
    """`auto` or `auto:8,16,32` -> the tree budgets the width policy chooses among each step (the chain, DFLASH's
    verify, always beside them), ascending; DDTreeConfigError naming `name`, the value and the form."""
    raw = str(text).strip().lower()
    fix = (f"expected auto (the budgets {','.join(map(str, AUTO_BUDGETS))}) or auto:B1,B2,... with each budget "
           f"1..{maximum}, increasing, e.g. auto:8,16,32")
    if not AUTO_TEXT.fullmatch(raw):
        raise DDTreeConfigError(f"{name}={str(text).strip() or chr(39) * 2} is invalid: {fix}")
    if raw == "auto":
        return AUTO_BUDGETS
    budgets = tuple(int(v) for v in raw.split(":", 1)[1].split(","))
    if any(not 1 <= b <= maximum for b in budgets) or any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
        raise DDTreeConfigError(f"{name}={raw} is invalid: {fix}")
    return budgets


def auto_problems(budgets: tuple[int, ...], topk_cap: Schedule, block_size: int | None,
                  names: SettingNames = PYTHON_NAMES) -> list[str]:
    """The single-value rules for every budget the policy may choose (one cap for all of them)."""
    if len(topk_cap.steps) > 1:
        return [f"{names.topk_cap}={topk_cap} is invalid with {names.budget}=auto: the width policy chooses the "
                f"budget each step and keeps one cap; give one value (e.g. {DEFAULT_TOPK_CAP})"]
    cap = topk_cap.at(1)
    out = []
    for budget in budgets:
        for message in DDTreeSettings(budget, min(cap, budget), block_size).problems(names):
            out.append(f"auto budget {budget}: {message}")
    return out


# --- the schedule of a server: (budget, cap) by running batch size, or auto ---------------------

NO_SPECULATION = (0, 1)     # the width policy's step without a draft: the root alone is verified (width 1)

@dataclass(frozen=True)
class WidthSchedule:
    """The budget and the top-k cap by running batch size (one step each for a plain value): the one schedule type
    of the plugin, the reference engine, the benchmarks and the sweep report (issue 73). The server is sized for
    the widest step (widest()); a decode step of b requests uses at(b).

    With `auto` (budgets the width policy chooses among) the budget schedule is the widest of them alone, and
    every step may run any of the trees, the chain (budget `chain`, cap 1: DFLASH's verify, width = the
    draft's block) or no speculation (budget 0: the root alone, width 1, no draft pass), at every running batch
    size."""

    budget: Schedule
    topk_cap: Schedule
    auto: tuple[int, ...] = ()      # the policy's tree budgets, ascending; () = the schedule decides
    chain: int | None = None        # the chain's budget (block - 1) when auto

    @classmethod
    def of(cls, budget: int | Schedule, topk_cap: int | Schedule) -> WidthSchedule:
        """One value or a Schedule each."""
        def one(value: int | Schedule) -> Schedule:
            return value if isinstance(value, Schedule) else Schedule(((1, int(value)),))
        return cls(one(budget), one(topk_cap))

    @classmethod
    def from_steps(cls, steps: list[tuple[int, tuple[int, int]]]) -> WidthSchedule:
        """(from batch, (budget, cap)) steps, the first from 1 -> the two schedules, each with its equal neighbours
        merged (budget 32 from 1 and from 8 is the one value 32)."""
        def merged(values: list[tuple[int, int]]) -> Schedule:
            return Schedule(tuple((start, v) for i, (start, v) in enumerate(values) if i == 0 or values[i - 1][1] != v))
        return cls(merged([(start, tree[0]) for start, tree in steps]), merged([(start, tree[1]) for start, tree in steps]))

    @classmethod
    def found(cls, best: dict[int, tuple[int, int]]) -> WidthSchedule:
        """THE finder of a schedule from measurements: `best` is the fastest (budget, cap) at each measured load (the
        running requests); each holds from its load up to the next measured load, the lowest from 1.

        Why this rule (and not a switch between two measured loads, e.g. at their geometric middle): every switch
        point is then a load that was measured, so the schedule claims nothing about a load below the one whose
        measurement chose it; and it is the rule the sweep's schedule.json has deployed since issue 32."""
        if not best:
            raise ValueError("no measured load to find a schedule from")
        loads = sorted(best)
        return cls.from_steps([(1 if i == 0 else load, best[load]) for i, load in enumerate(loads)])

    def at(self, batch: int) -> tuple[int, int]:
        """(budget, cap) for a running batch of `batch` requests (with auto: the widest tree's)."""
        return self.budget.at(batch), self.topk_cap.at(batch)

    @property
    def steps(self) -> list[tuple[int, tuple[int, int]]]:
        """(from batch, (budget, cap)) where the tree changes."""
        out: list[tuple[int, tuple[int, int]]] = []
        for start in schedule_batches(self.budget, self.topk_cap):
            if not out or out[-1][1] != self.at(start):
                out.append((start, self.at(start)))
        return out

    @property
    def trees(self) -> list[tuple[int, int]]:
        """Every (budget, cap) some batch size runs, ascending."""
        return sorted({tree for _, tree in self.steps})

    def widest(self, block_size: int | None = None) -> DDTreeSettings:
        return DDTreeSettings(max(self.budget.values), max(self.topk_cap.values), block_size)

    @property
    def stepped(self) -> bool:
        return len(self.budget.steps) > 1 or len(self.topk_cap.steps) > 1

    def choices(self) -> tuple[tuple[int, int], ...]:
        """The (budget, cap) pairs a step of the width policy may run, narrowest first: no speculation
        (NO_SPECULATION, budget 0), the chain, then each tree (its cap at most its budget). () without auto."""
        if not self.auto:
            return ()
        cap = self.topk_cap.at(1)
        trees = [(b, min(cap, b)) for b in self.auto]
        chain = [(self.chain, 1)] if self.chain is not None else []
        return (NO_SPECULATION,) + tuple(sorted(set(chain + trees), key=lambda p: (p[0] + 1, p[1])))

    def pairs(self, max_bs: int) -> set[tuple[int, int]]:
        """Every (budget, cap) some step of this server may run (one tree each is built at start-up; no speculation
        builds none)."""
        if self.auto:
            return set(self.choices()) - {NO_SPECULATION}
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

    def problems(self, block_size: int | None, names: SettingNames = SERVER_FLAGS) -> list[str]:
        if self.auto:
            return auto_problems(self.auto, self.topk_cap, block_size, names)
        return schedule_problems(self.budget, self.topk_cap, block_size, names)

    def __str__(self) -> str:
        if self.auto:
            budgets = ",".join(map(str, self.auto))
            return f"budget auto:{budgets} (and the chain, and no speculation) cap {self.topk_cap}"
        return f"budget {self.budget} cap {self.topk_cap}"
