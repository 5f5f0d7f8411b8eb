"""The reference engine with DDTREE's width chosen per step by ddtree.width_policy (issue 70).

Each step verifies the option the step before planned (the first step: `first`, the chain by default): no
speculation (only the root: the target's own next token), the chain (budget L, cap 1) or a tree budget; then, from
this step's draft, the widest tree is built and the policy plans the next step's option (a device tensor, read by the
host after the step's commit - its one synchronisation). The calibration learns from the tree each step verified.
Any tree is verified exactly, so the output is the target's whatever the policy picks. Eager, one batch at a time.
"""

from __future__ import annotations

import torch

from ddtree.reference.engine import Decoder
from ddtree.reference.pair import Pair
from ddtree.reference.step import BatchState, StepIO
from ddtree.tree import root_only_tree
from ddtree.width_policy import WidthPolicy


class PolicyDecoder(Decoder):
    """Decoder(pair, "ddtree") whose every step takes the width `policy` planned; `chosen` records them."""

    def __init__(self, pair: Pair, policy: WidthPolicy, first: str = "chain"):
        depth = pair.block_size - 1
        super().__init__(pair, "ddtree", max([depth] + [o.budget for o in policy.options]),
                         max(o.cap for o in policy.options))
        names = [o.name for o in policy.options]
        self.policy = policy
        if policy.calibration is not None:
            policy.calibration.to(self.device)
        self.choice = names.index(first) if first in names else 0
        self.planned: torch.Tensor | None = None
        self.running = 0
        self.chosen: list[str] = []

    def step_io(self, state: BatchState) -> StepIO:
        io = super().step_io(state)
        option = self.policy.options[self.choice]
        self.chosen.append(option.name)
        self.running = sum(state.active)
        io.budget, io.topk_cap = option.budget, option.cap
        return io

    def stages(self):
        return [*super().stages(), ("plan", self._stage_plan)]

    def _stage_build(self, io: StepIO) -> None:
        if io.budget == 0:
            io.tree = root_only_tree(io.roots, self.depth)
        else:
            super()._stage_build(io)

    def _stage_plan(self, io: StepIO) -> None:
        """Learn from the verified tree; plan the next step from this step's widest tree (no host read here)."""
        if self.policy.calibration is not None and io.budget > 0:
            self.policy.calibration.update(io.tree, io.verdict.accept_len, io.live)
        self.planned = self.policy.plan_from_draft(io.draft_logits, io.tree.tokens[:, 0], max(self.running, 1), io.live)

    def finish_step(self, state: BatchState, io: StepIO) -> list[list[int]]:
        out = super().finish_step(state, io)           # the commit: the step's one host synchronisation
        self.choice = int(self.planned)
        return out
