"""The width policy inside a DDTREE decode step (issue 70, item 2; no SGLang import).

`--speculative-ddtree-budget auto[:B1,B2,..]`: each step runs no speculation (the root alone, width 1, no draft
pass: the bonus token is the whole step), the chain (DFLASH's verify: the draft's top-1 path, width = the draft's
block) or one of the trees, whichever has the most expected accepted tokens (+1, the bonus) per millisecond of the
step, for the running batch. A step without speculation has no draft to observe, so the expectations stay those last
read; after `refresh_every` such steps in a row one speculative step (the best of them by those expectations) runs
to read the draft again. A batch with a grammar always speculates (its root's mask comes from the constrained
tree's build). Per step:

  choose(bs)            host: the option of this step, from the expectations of the decode step `lag` steps back.
                        Those are on the device until the host reads them from pinned memory after that step's CUDA
                        event - an event the scheduler's own synchronisation on that step's tokens has already
                        passed (lag 1 without the overlap scheduler: it reads step t-1's tokens before it plans step
                        t; lag 2 with it: step t is launched before step t-1's tokens are read), so the wait returns
                        at once and the step adds no synchronisation. The chain until the first expectations exist.
  observe(tree, cand)   device: every option's expected accepted tokens + 1, the mean over the batch, from this step's
                        draft (its widest tree; built beside the step's own when the step runs a narrower one), the
                        draft's calibration applied (width_policy.Calibration), copied into this step's pinned slot.
  learn(tree, accepted) device: the calibration's sums from the verified tree and the accepted lengths.

On a GPU the two device parts run as CUDA graphs (PolicyGraphs: one per captured batch size, padded rows masked;
learn's also per verified width), captured at start-up: eager they are ~40 small kernels a step, ~1 ms of host launch
time at one request on the H200 (2026-12-06), which a host-bound step pays in full; a graph is one launch and three
input copies.

A step's price is the table's (graph_timing: the draft's pass + the verify at the width, by batch) times what the
server has measured of that option's steps against it (measured_costs: each step's period credited to the step it
waited for, a ratio per option and batch band; the table alone with SGLANG_DDTREE_COST_LEARN=0). An option not run
at a band for a while is run once to be measured again (seldom when it scores far below the best). Every rank must
choose alike: the expectations are computed from the same candidates on every rank (their all-gather), the table is
rank 0's (shared at start-up), the measured ratios are rank 0's, taken every `share_every` steps through the CPU
group (at TP 1 this rank's, every step), and the re-measuring follows the choices, which are the same on every rank.

Losslessness does not depend on any of this: every step verifies its tree exactly (ddtree.verify).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ddtree.settings import DDTreeConfigError
from ddtree.sglang.policy.measured_costs import MeasuredCosts
from ddtree.tree import build_tree_from_candidates
from ddtree.types import Candidates, DraftTree
from ddtree.width_policy import NO_SPECULATION, Calibration, CostCurve, Option, WidthPolicy

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """One step's expectations and the draft's calibration on their way to the host: float32 [n options + L + 1]
    in pinned memory, and its event."""

    values: torch.Tensor
    event: torch.cuda.Event | None = None
    step: int = -1


@dataclass
class ObserveGraph:
    """One padded batch size's expectations as a CUDA graph: its static inputs (rows past the batch masked by
    `live`) and its output, float32 [n options (+ L + 1: the calibration's scale)]."""

    scores: torch.Tensor            # float32 [bs, Nw]  the widest tree's log path probabilities
    depths: torch.Tensor            # int64 [bs, Nw]
    top1: torch.Tensor              # float32 [bs, L]   the draft's top-1 log-probabilities (the chain)
    live: torch.Tensor              # float32 [bs]      1 for the running requests, 0 for padding
    out: torch.Tensor               # float32 [n (+ L + 1)]
    graph: torch.cuda.CUDAGraph | None = None
    live_rows: int = -1             # the running requests `live` holds now (host: rewritten only when it changes)


@dataclass
class LearnGraph:
    """One padded batch size and verified width's calibration update as a CUDA graph."""

    scores: torch.Tensor            # float32 [bs, N]  the verified tree's
    depths: torch.Tensor            # int64 [bs, N]
    accept: torch.Tensor            # int64 [bs]       draft tokens each request accepted
    live: torch.Tensor              # float32 [bs]
    graph: torch.cuda.CUDAGraph | None = None
    live_rows: int = -1


def set_live(graph: ObserveGraph | LearnGraph, rows: int) -> None:
    """The graph's live mask: the first `rows` of its padded batch (no copy when it holds them already)."""
    if graph.live_rows != rows:
        graph.live.zero_()
        graph.live[:rows].fill_(1.0)
        graph.live_rows = rows


class PolicyGraphs:
    """The width policy's device work (observe's expectations, learn's calibration update) captured as CUDA graphs
    at start-up, one per batch size SGLang captured (a running batch is padded to the next; its padding rows are
    masked), learn's also per verified width. A batch past the largest runs eagerly."""

    def __init__(self, policy: WidthPolicy, batch_sizes: Iterable[int], tree_width: int, device):
        self.policy = policy
        self.sizes = sorted(set(batch_sizes))
        self.device = torch.device(device)
        self.pool = torch.cuda.graph_pool_handle()
        depth = policy.calibration.depth if policy.calibration is not None else 0
        n = len(policy.options) + (depth + 1 if policy.calibration is not None else 0)
        saved = policy.calibration.state() if policy.calibration is not None else None
        self.observe: dict[int, ObserveGraph] = {}
        self.learn: dict[tuple[int, int], LearnGraph] = {}
        for bs in self.sizes:
            self.observe[bs] = self._observe_graph(bs, tree_width, depth, n)
            if policy.calibration is not None:
                for width in sorted({o.width for o in policy.options if o.speculates}):   # none learns nothing
                    self.learn[(bs, width)] = self._learn_graph(bs, width)
        if saved is not None:
            policy.calibration.restore(saved)      # the warm-up runs updated it

    def padded(self, bs: int) -> int | None:
        i = bisect.bisect_left(self.sizes, bs)
        return self.sizes[i] if i < len(self.sizes) else None

    def _capture(self, run: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """`run` once on a side stream (lazy initialisation: the option tensors, the sort's workspace), then
        captured into a graph of the shared pool."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            run()
        return graph

    def _observe_graph(self, bs: int, width: int, depth: int, n: int) -> ObserveGraph:
        g = ObserveGraph(scores=torch.zeros(bs, width, device=self.device),
                         depths=torch.full((bs, width), -1, dtype=torch.long, device=self.device),
                         top1=torch.zeros(bs, max(depth, 1), device=self.device),
                         live=torch.zeros(bs, device=self.device), out=torch.zeros(n, device=self.device))
        g.graph = self._capture(lambda: g.out.copy_(observed(self.policy, g.scores, g.depths, g.top1, g.live)))
        return g

    def _learn_graph(self, bs: int, width: int) -> LearnGraph:
        g = LearnGraph(scores=torch.zeros(bs, width, device=self.device),
                       depths=torch.full((bs, width), -1, dtype=torch.long, device=self.device),
                       accept=torch.zeros(bs, dtype=torch.long, device=self.device),
                       live=torch.zeros(bs, device=self.device))
        g.graph = self._capture(lambda: self.policy.calibration.update_from(g.scores, g.depths, g.accept, g.live))
        return g

    def run_observe(self, tree: DraftTree, top1: torch.Tensor) -> torch.Tensor | None:
        """observed() of the widest tree [bs, Nw] and the draft's top-1 log-probabilities [bs, L] by its graph: its
        output tensor (overwritten by the next replay), or None where no graph holds the batch."""
        bs = tree.batch_size
        pad = self.padded(bs)
        if pad is None:
            return None
        g = self.observe[pad]
        g.scores[:bs].copy_(tree.scores)
        g.depths[:bs].copy_(tree.depths)
        g.top1[:bs].copy_(top1)
        set_live(g, bs)
        g.graph.replay()
        return g.out

    def run_learn(self, tree: DraftTree, accept_len: torch.Tensor) -> bool:
        """The calibration update by its graph; False where no graph holds the batch or the width."""
        bs = tree.batch_size
        pad = self.padded(bs)
        g = self.learn.get((pad, tree.width)) if pad is not None else None
        if g is None:
            return False
        g.scores[:bs].copy_(tree.scores)
        g.depths[:bs].copy_(tree.depths)
        g.accept[:bs].copy_(accept_len)
        set_live(g, bs)
        g.graph.replay()
        return True


def observed(policy: WidthPolicy, scores: torch.Tensor, depths: torch.Tensor, top1: torch.Tensor,
             live: torch.Tensor | None = None) -> torch.Tensor:
    """A step's slot values, float32 [n options (+ L + 1)]: each option's expected accepted tokens + 1, the mean
    over the live requests, then the calibration's scale by depth. scores, depths [bs, Nw] (the widest tree); top1
    [bs, L]; live [bs] (None: every row)."""
    scale = policy.calibration_scale(scores.device)                                        # [L + 1] or None
    total = policy.expectations_from(scores, depths, top1, live, scale)                    # [n]
    rows = live.sum().clamp(min=1.0) if live is not None else scores.shape[0]
    mean = total / rows
    return torch.cat([mean, scale]) if scale is not None else mean


@dataclass
class Choices:
    """How many steps ran each option (counted on the host, read by the metrics)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, option: Option) -> None:
        self.counts[option.name] = self.counts.get(option.name, 0) + 1


class StepPolicy:
    """The options, their step costs (the table's, corrected by what was measured), the slots the expectations come
    back in."""

    def __init__(self, policy: WidthPolicy, lag: int, device, *,
                 clock: Callable[[], float] = time.perf_counter,
                 share: Callable[[list[float]], list[float]] | None = None, share_every: int = 16,
                 refresh_every: int = 16, learn_costs: bool = True, kernels: str | None = None):
        if lag < 1:
            raise ValueError(f"lag={lag}: the host reads a step's expectations at the earliest one step later")
        if refresh_every < 1:
            raise ValueError(f"refresh_every={refresh_every}: at least one step without speculation before a refresh")
        self.refresh_every = refresh_every
        self.kernels = kernels                                 # the tree build's backend (None: DDTREE_BACKEND now)
        self.unspeculated = 0                                  # steps without speculation in a row
        self.policy = policy
        self.lag = lag
        self.device = device
        self.measured = MeasuredCosts(len(policy.options), offset=lag - 1, learn=learn_costs)
        self.clock = clock
        self.share = share                         # rank 0's measured ratios for every rank (None at TP 1)
        self.share_every = share_every
        self.chain = next((i for i, o in enumerate(policy.options) if o.name == "chain"), 0)
        trees = [o for o in policy.options if o.is_tree]
        self.tree_budget = policy.widest                                # the widest tree, built every step
        self.tree_cap = max((o.cap for o in trees), default=1)
        self.cand_cap = max(o.cap for o in policy.options)               # candidates the expectations read
        pinned = torch.cuda.is_available() and torch.device(device).type == "cuda"
        n = len(policy.options) + (policy.calibration.depth + 1 if policy.calibration is not None else 0)
        self.slots = [Slot(torch.zeros(n, dtype=torch.float32, pin_memory=pinned)) for _ in range(lag + 1)]
        self.latest: list[float] = []                          # the last expectations read (host), by option
        self.scale: list[float] = []                           # the draft's calibration then, by depth
        self.step = 0                                          # decode steps so far
        self.choices = Choices()
        self.graphs: PolicyGraphs | None = None                # capture(): observe and learn as CUDA graphs
        self._costs: dict[int, list[float]] = {}              # the table's device ms by option, by running batch

    @property
    def options(self) -> tuple[Option, ...]:
        return self.policy.options

    # --- host ----------------------------------------------------------------------------------------------------

    def interrupted(self) -> None:
        """A prefill or idle step ran: the next decode step's period would include it."""
        self.measured.interrupted()

    def choose(self, bs: int, speculate: bool = False) -> Option:
        """This step's option for a running batch of `bs` (host work only). speculate: no step without speculation
        (a batch with a grammar)."""
        now = self.clock()
        self._read_back()
        if self.share is None or self.step % self.share_every == 0:
            self.measured.publish(self.share)
        table = self._costs.get(bs)                                                        # device ms by option
        if table is None:
            table = self._costs[bs] = self.policy.costs(bs)
        prices = self.measured.priced(bs, table)
        if not self.latest:
            index = self.chain
        else:
            score = [e / c for e, c in zip(self.latest, prices)]
            allowed = [i for i, o in enumerate(self.options)
                       if o.speculates or not (speculate or self.unspeculated >= self.refresh_every)]
            index = self.measured.due(bs, self.step, score, allowed)
            if index is None:
                index = max(allowed, key=score.__getitem__)
        self.unspeculated = 0 if self.options[index].speculates else self.unspeculated + 1
        self.measured.started(now, bs, index, table[index], prices[index], self.step)
        option = self.options[index]
        self.choices.add(option)
        self.step += 1
        return option

    def _read_back(self) -> None:
        """The slot of the step `lag` steps back, if it holds one (its event already passed: see the module)."""
        slot = self.slots[(self.step - self.lag) % len(self.slots)] if self.step >= self.lag else None
        if slot is None or slot.step != self.step - self.lag:
            return
        if slot.event is not None:                    # None on the CPU: the copy is done
            slot.event.synchronize()
        values = slot.values.tolist()                 # pinned host memory
        n = len(self.options)
        self.latest, self.scale = values[:n], values[n:]

    # --- device --------------------------------------------------------------------------------------------------

    def observe(self, step_tree: DraftTree, widest: Candidates, roots: torch.Tensor, step_budget: int,
                step_cap: int) -> None:
        """This step's expectations into its slot. widest: the head's candidates [bs, L, K(widest)]; roots [bs]."""
        tree = self.widest_tree(step_tree, widest, roots, step_budget, step_cap)
        top1 = widest.logp[..., 0]                                                         # [bs, L]
        mean = self.graphs.run_observe(tree, top1) if self.graphs is not None else None
        if mean is None:
            mean = observed(self.policy, tree.scores, tree.depths, top1)                   # [n (+ L + 1)]
        slot = self.slots[(self.step - 1) % len(self.slots)]                               # choose() counted it
        slot.values.copy_(mean, non_blocking=True)
        if slot.event is None and torch.device(self.device).type == "cuda":
            slot.event = torch.cuda.Event()
        if slot.event is not None:
            slot.event.record()
        slot.step = self.step - 1

    def widest_tree(self, step_tree: DraftTree, widest: Candidates, roots: torch.Tensor, step_budget: int,
                    step_cap: int) -> DraftTree:
        """The widest option's tree: this step's own when it is that tree, else built from the candidates."""
        if step_budget == self.tree_budget and step_cap == self.tree_cap:
            return step_tree
        k = min(widest.logp.shape[-1], self.tree_cap)
        cand = Candidates(logp=widest.logp[..., :k].contiguous(), tokens=widest.tokens[..., :k].contiguous())
        return build_tree_from_candidates(cand, roots, self.tree_budget, self.kernels)

    def learn(self, tree: DraftTree, accept_len: torch.Tensor) -> None:
        """The calibration's sums from the verified tree [bs, N] and the draft tokens each request accepted [bs] (a
        step without speculation verified no draft token: nothing to learn)."""
        if self.policy.calibration is None or tree.width == 1:
            return
        if self.graphs is None or not self.graphs.run_learn(tree, accept_len):
            self.policy.calibration.update(tree, accept_len)

    def capture(self, batch_sizes: Iterable[int]) -> PolicyGraphs:
        """observe's and learn's CUDA graphs for these batch sizes (start-up; a GPU only)."""
        self.graphs = PolicyGraphs(self.policy, batch_sizes, self.tree_budget + 1, self.device)
        return self.graphs


def option_of(budget: int, cap: int, chain_budget: int | None) -> Option:
    """The policy's option for one (budget, cap) choice: budget 0 is no speculation, (chain_budget, 1) the chain."""
    if budget == 0:
        return NO_SPECULATION
    if budget == chain_budget and cap == 1:
        return Option("chain", budget, 1, budget + 1)
    return Option(f"b{budget}", budget, cap, budget + 1)


def step_policy_for(choices: tuple[tuple[int, int], ...], chain_budget: int | None, curve: CostCurve, depth: int,
                    lag: int, device, *, share=None, learn_costs: bool = True,
                    kernels: str | None = None) -> StepPolicy:
    """The StepPolicy of a width schedule's choices ((budget, cap) pairs; the chain's is (chain_budget, 1), no
    speculation's (0, 1)). A measured table without width 1 (a sweep's from before no speculation was an option)
    leaves no speculation out, and says so."""
    widths = {w for _, w in curve.table}
    if any(budget == 0 for budget, _ in choices) and 1 not in widths:
        logger.warning("DDTREE width policy: the step costs hold no width 1, so no step runs without speculation "
                       "(time the graphs at start-up, or give a table with width 1)")
        choices = tuple(c for c in choices if c[0] != 0)
    options = [option_of(budget, cap, chain_budget) for budget, cap in choices]
    try:
        policy = WidthPolicy(tuple(options), curve, Calibration(depth).to(device))
    except ValueError as e:
        raise DDTreeConfigError(f"the step costs cannot price every width of the width policy: {e}; a table in "
                                "SGLANG_DDTREE_COST_TABLE must hold each width (budget + 1 for each tree, the draft's "
                                "block for the chain, 1 for no speculation) at one batch size at least") from None
    return StepPolicy(policy, lag, device, share=share, learn_costs=learn_costs, kernels=kernels)
