"""A tree only as wide as it earns (issue 70): each step's width chosen by expected accepted tokens per unit of cost.

DDTree's best-first tree of budget B is the B most probable draft paths, so the draft's expected accepted length of
every smaller budget is a prefix sum of the widest tree's path probabilities, sorted (the surrogate the paper
maximises: what the tree would accept if the draft's marginals were the target's). What a width costs is measured: a
verify forward of batch x width tokens (on Kimi's MoE it grows with the routed experts the tokens pick;
docs/cost-model.md). The policy takes, for the running batch, the option with the most

    sum over requests of (expected accepted tokens + 1)  /  cost(batch, width)

among: no speculation (width 1, the bonus token alone), the chain (DFLASH's verify: the draft's top-1 path, width
L + 1) and each tree budget (width budget + 1). The draft's calibration - the acceptance it predicted at each depth
against what was accepted - is tracked (decayed sums) and scales each depth's path probabilities before the sum, so an
overconfident draft does not buy width it does not earn.

When: the choice of a step is planned from the previous step's draft (its probabilities are on the device; the host
reads the plan after the previous step's own synchronisation, where the scheduler reads the accepted tokens), so a
decode step adds no host synchronisation. Losslessness does not depend on it: any tree, of any width, is verified
exactly (ddtree.verify); the policy only decides how many nodes the next verify carries.

    policy = WidthPolicy(options_for((8, 16, 32, 64), depth=7, cap=8), CostCurve(table))
    plan = policy.plan_from_draft(draft_logits, roots, batch)    # device int64 []: an index into policy.options
    policy.calibration.update(tree_verified, accept_len)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from ddtree import _checks
from ddtree.tree import build_tree_from_candidates, candidate_count, draft_candidates
from ddtree.types import Candidates, DraftTree


@dataclass(frozen=True)
class Option:
    """One width a step can verify."""
    name: str          # "none", "chain" or "b<budget>"
    budget: int        # draft nodes: 0 (none), L (chain), the tree's budget
    cap: int           # candidates per depth (1 for the chain)
    width: int         # tokens a request sends through the target: budget + 1

    @property
    def is_tree(self) -> bool:
        return self.name.startswith("b")

    @property
    def speculates(self) -> bool:
        """False for no speculation (budget 0: the root alone, no draft pass)."""
        return self.budget > 0


NO_SPECULATION = Option("none", 0, 1, 1)      # the bonus token alone: width 1


def options_for(budgets: Iterable[int], depth: int, cap: int, none: bool = True, chain: bool = True) -> tuple[Option, ...]:
    """none (width 1), the chain (width L + 1) and a tree per budget, narrowest first."""
    _checks.check_positive_int("depth", depth)
    _checks.check_positive_int("cap", cap)
    out = [NO_SPECULATION] if none else []
    if chain:
        out.append(Option("chain", depth, 1, depth + 1))
    for b in sorted(set(budgets)):
        _checks.check_positive_int("budget", b)
        out.append(Option(f"b{b}", b, cap, b + 1))
    if not out:
        raise _checks.fail("options", "[]", "expected at least one of none, the chain or a budget")
    return tuple(out)


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of one step by (running batch, width), measured: the plugin's start-up timing of its graphs, or a
    sweep's table. A batch between measured ones costs as the next measured one up (a CUDA graph pads to it); past
    the largest, in proportion to it."""
    table: Mapping[tuple[int, int], float]

    def __post_init__(self):
        if not self.table:
            raise _checks.fail("cost curve", "{}", "expected at least one (batch, width) -> ms")
        bad = [k for k, v in self.table.items() if not v > 0]
        if bad:
            raise _checks.fail(f"cost curve at (batch, width) {bad[0]}", self.table[bad[0]], "expected a time > 0 ms")

    @classmethod
    def from_function(cls, ms, batches: Iterable[int], widths: Iterable[int]) -> "CostCurve":
        return cls({(b, w): float(ms(b, w)) for b in batches for w in widths})

    def at(self, batch: int, width: int) -> float:
        batches = sorted(b for b, w in self.table if w == width)
        if not batches:
            raise _checks.fail("width", width, f"no cost measured at this width (measured: "
                                               f"{sorted({w for _, w in self.table})})")
        i = bisect.bisect_left(batches, batch)
        if i < len(batches):
            return self.table[(batches[i], width)]
        top = batches[-1]
        return self.table[(top, width)] * batch / top


def node_values(tree: DraftTree, scale: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [bs, N]: each non-root node's path probability (times its depth's calibration), 0 for the root and
    padding."""
    return path_values(tree.scores, tree.depths, scale)


def path_values(scores: torch.Tensor, depths: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """node_values from a tree's scores (log path probabilities) [bs, N] and depths [bs, N]."""
    p = torch.where(depths > 0, scores.float().exp(), torch.zeros_like(scores, dtype=torch.float32))
    if scale is not None:
        p = p * scale[depths.clamp(min=0)]
    return p


def tree_expectations(tree: DraftTree, budgets: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Expected accepted draft tokens [bs, len(budgets)] of the best tree of each budget, from a tree at least that
    wide: the sum of its `budget` largest node values (the best-first tree of budget B is the B best paths)."""
    return budget_expectations(node_values(tree, scale), budgets)


def budget_expectations(values: torch.Tensor, budgets: torch.Tensor) -> torch.Tensor:
    """tree_expectations from the widest tree's node values [bs, N] (path_values)."""
    ranked = values.sort(dim=-1, descending=True).values                                   # [bs, N]
    sums = torch.cumsum(ranked, dim=-1)                                                    # [bs, N]: first k+1 nodes
    index = (budgets - 1).clamp(min=0, max=sums.shape[-1] - 1)                             # [n]
    return torch.where(budgets > 0, sums[:, index], torch.zeros_like(sums[:, index]))


def chain_expectation(cand: Candidates, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Expected accepted tokens [bs] of the draft's top-1 path (DFLASH's chain): sum over depth of the probability
    that every top-1 token up to it is right."""
    return top1_expectation(cand.logp[..., 0], scale)


def top1_expectation(top1_logp: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """chain_expectation from the draft's top-1 log-probabilities [bs, L]."""
    reach = torch.cumsum(top1_logp.float(), dim=-1).exp()                                   # [bs, L]
    if scale is not None:
        reach = reach * scale[1: reach.shape[-1] + 1]
    return reach.sum(-1)


@dataclass
class Calibration:
    """Acceptance the draft predicted at each depth against what was accepted, as decayed sums (device tensors)."""
    depth: int
    decay: float = 0.98
    prior: float = 4.0                      # pseudo-steps at ratio 1: a new server trusts the draft until it learns
    predicted: torch.Tensor = field(default=None)
    observed: torch.Tensor = field(default=None)
    steps: torch.Tensor = field(default=None)   # decayed count of the updates

    def __post_init__(self):
        if not 0 < self.decay <= 1:
            raise _checks.fail("decay", self.decay, "expected 0 < decay <= 1")
        for name, shape in (("predicted", (self.depth + 1,)), ("observed", (self.depth + 1,)), ("steps", ())):
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(shape))

    def to(self, device) -> "Calibration":
        self.predicted, self.observed, self.steps = (t.to(device) for t in (self.predicted, self.observed, self.steps))
        return self

    def update(self, tree: DraftTree, accept_len: torch.Tensor, live: torch.Tensor | None = None) -> None:
        """The verified tree [bs, N] and how many of its draft tokens each request accepted [bs]: each depth's
        predicted acceptance (the sum of its nodes' path probabilities) and the observed one (accept_len >= depth)."""
        self.update_from(tree.scores, tree.depths, accept_len, live)

    def update_from(self, scores: torch.Tensor, depths: torch.Tensor, accept_len: torch.Tensor,
                    live: torch.Tensor | None = None) -> None:
        """update() from the verified tree's scores and depths [bs, N]; the sums change in place (their storage
        stays: a CUDA graph of the policy reads and writes them, step_policy.PolicyGraphs)."""
        levels = torch.arange(self.depth + 1, device=depths.device)                           # [L+1]
        p = path_values(scores, depths)                                                       # [bs, N]
        at_depth = depths[:, :, None] == levels                                               # [bs, N, L+1]
        pred = (p[:, :, None] * at_depth).sum(1)                                              # [bs, L+1]
        obs = (accept_len[:, None] >= levels).float()                                         # [bs, L+1]
        if live is not None:
            pred, obs = pred * live[:, None], obs * live[:, None]
        self.predicted.mul_(self.decay).add_(pred.sum(0))
        self.observed.mul_(self.decay).add_(obs.sum(0))
        self.steps.mul_(self.decay).add_(1)

    def state(self) -> tuple[torch.Tensor, ...]:
        """Copies of the sums (PolicyGraphs puts them back after its warm-up runs)."""
        return tuple(t.clone() for t in (self.predicted, self.observed, self.steps))

    def restore(self, state: tuple[torch.Tensor, ...]) -> None:
        for mine, saved in zip((self.predicted, self.observed, self.steps), state):
            mine.copy_(saved)

    def scale(self) -> torch.Tensor:
        """float32 [L+1]: observed over predicted acceptance per depth, weighted toward 1 by `prior` pseudo-steps
        (steps / (steps + prior)); 1 at the root and at depths the trees never reached."""
        seen = self.predicted > 1e-6
        ratio = torch.where(seen, self.observed / self.predicted.clamp(min=1e-6), torch.ones_like(self.predicted))
        weight = self.steps / (self.steps + self.prior)
        out = (1 + weight * (ratio - 1)).clamp(min=0.0, max=4.0)
        out[:1].fill_(1.0)                  # a kernel argument, not a host copy (CUDA-graph capturable)
        return out


@dataclass
class WidthPolicy:
    options: tuple[Option, ...]
    curve: CostCurve
    calibration: Calibration | None = None
    _option_tensors: dict = field(default_factory=dict, init=False, repr=False)   # device -> option_tensors()

    def __post_init__(self):
        for o in self.options:
            for batch in sorted({b for b, _ in self.curve.table}):
                self.curve.at(batch, o.width)                   # every option's width measured, or refused by name

    @property
    def widest(self) -> int:
        """The widest tree budget among the options (1 when there is none: the chain reads only top-1 candidates)."""
        return max((o.budget for o in self.options if o.is_tree), default=1)

    def costs(self, batch: int) -> list[float]:
        return [self.curve.at(batch, o.width) for o in self.options]

    def option_tensors(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(tree budgets int64 [n] (0 for none and the chain), is-chain bool [n]) on `device`, made once per device
        (a decode step copies nothing from the host)."""
        key = str(device)
        if key not in self._option_tensors:
            self._option_tensors[key] = (
                torch.tensor([o.budget if o.is_tree else 0 for o in self.options], device=device),
                torch.tensor([o.name == "chain" for o in self.options], device=device))
        return self._option_tensors[key]

    def calibration_scale(self, device) -> torch.Tensor | None:
        """The calibration's per-depth scale [L+1] on `device` (None without a calibration)."""
        return self.calibration.scale().to(device) if self.calibration is not None else None

    def expectations(self, tree: DraftTree, cand: Candidates, live: torch.Tensor | None = None,
                     scale: torch.Tensor | None = None) -> torch.Tensor:
        """Expected accepted tokens + 1 of every option, summed over the live requests: float32 [len(options)].
        scale: the calibration's, when the caller has it already (else computed here)."""
        if scale is None:
            scale = self.calibration_scale(tree.scores.device)
        return self.expectations_from(tree.scores, tree.depths, cand.logp[..., 0], live, scale)

    def expectations_from(self, scores: torch.Tensor, depths: torch.Tensor, top1_logp: torch.Tensor,
                          live: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
        """expectations() from the widest tree's scores and depths [bs, N] and the draft's top-1 log-probabilities
        [bs, L]."""
        budgets, is_chain = self.option_tensors(scores.device)                             # [n], [n]
        per = budget_expectations(path_values(scores, depths, scale), budgets)             # [bs, n]
        chain = top1_expectation(top1_logp, scale)                                         # [bs]
        per = torch.where(is_chain, chain[:, None], per) + 1.0                             # [bs, n]
        if live is not None:
            per = per * live[:, None]
        return per.sum(0)

    def plan(self, tree: DraftTree, cand: Candidates, batch: int, live: torch.Tensor | None = None) -> torch.Tensor:
        """The next step's option: int64 [] on the device (the host reads it after its next synchronisation). tree:
        the widest tree of this step's draft; cand: its candidates (the chain's top-1 path)."""
        widest = max((o.budget for o in self.options if o.is_tree), default=0)
        if tree.width < widest + 1:
            raise _checks.fail("tree width", tree.width, f"expected a tree as wide as the widest option ({widest + 1})")
        cost = torch.tensor(self.costs(batch), device=tree.scores.device)
        return torch.argmax(self.expectations(tree, cand, live) / cost)

    def plan_from_draft(self, draft_logits: torch.Tensor, roots: torch.Tensor, batch: int,
                        live: torch.Tensor | None = None) -> torch.Tensor:
        """plan() from a step's draft logits [bs, L, V] and roots [bs]: its candidates (the options' widest cap) and
        its widest tree."""
        cap = max(o.cap for o in self.options)
        cand = draft_candidates(draft_logits, candidate_count(cap, self.widest, draft_logits.shape[-1]))
        return self.plan(build_tree_from_candidates(cand, roots, self.widest), cand, batch, live)
