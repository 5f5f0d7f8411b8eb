"""Offline acceptance count: how many draft tokens a tree would accept along a known continuation.

A check on the decoder, computed independently of its KV cache, compaction and draft-context
updates: one causal target pass over prompt + continuation gives every hidden state; at each step
the draft sees the context before the root (DFlashDraft.block_logits), the tree is built, and the
walk accepts the longest path that spells the continuation. With the target's own greedy
continuation (temperature 0) the per-step accept lengths must equal the decoder's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree import DraftTree, Verdict, build_tree
from ddtree.reference.pair import Pair
from ddtree.verify import walk_tree
from ddtree.width_policy import WidthPolicy


def walk_inputs(pair: Pair, prompt: list[int], continuation: list[int], need: int) -> tuple[torch.Tensor, torch.Tensor]:
    """prompt + continuation as one sequence [1, T] and the target hidden states the draft reads along it (one causal
    pass); the continuation must hold `need` tokens."""
    if len(continuation) < need:
        raise ValueError(f"continuation has {len(continuation)} tokens: expected at least {need} "
                         "(the tokens the steps can emit + L + 1)")
    dev = pair.target.lm_head.weight.device
    seq = torch.tensor([prompt + continuation], dtype=torch.int64, device=dev)       # [1, T]
    return seq, pair.target.forward_sequence(seq, capture=tuple(pair.draft.config.target_layer_ids)).hidden


def draft_at(pair: Pair, seq: torch.Tensor, hidden: torch.Tensor, root: int) -> torch.Tensor:
    """The draft's logits [1, L, V] for the block after position `root`, from the context before it."""
    return pair.draft.block_logits(hidden[:, :root + 1], seq[:, :root + 1],
                                   torch.tensor([[root]], device=seq.device))[:, 0]


def walk_along(tree: DraftTree, seq: torch.Tensor, root: int) -> Verdict:
    """The tree's verdict along the known continuation: the target's token after each node is seq[root + depth + 1]."""
    after = (root + tree.depths.clamp(min=0) + 1).clamp(max=seq.shape[1] - 1)           # [1, N]
    return walk_tree(tree, seq.gather(1, after))


@torch.no_grad()
def offline_accept_lengths(pair: Pair, prompt: list[int], continuation: list[int], *, budget: int,
                           topk_cap: int, max_new_tokens: int | None = None,
                           max_steps: int | None = None) -> list[int]:
    """Accepted draft tokens per step, until max_new_tokens are emitted and/or max_steps are taken.

    continuation: the target's greedy continuation of prompt, long enough for every step's walk:
    at least max_new_tokens + L + 1 tokens, or max_steps * (L + 1) + L + 1. Compare with the
    decoder over the same number of steps (max_steps): stopping at a token count instead lets the
    last step overshoot, which biases tokens per step upward.
    """
    depth = pair.block_size - 1
    if max_new_tokens is None and max_steps is None:
        raise ValueError("offline_accept_lengths needs max_new_tokens or max_steps")
    seq, hidden = walk_inputs(pair, prompt, continuation,
                              max(max_new_tokens or 0, (max_steps or 0) * (depth + 1)) + depth + 1)
    root, emitted, accepts = len(prompt) - 1, 0, []
    while (max_new_tokens is None or emitted < max_new_tokens) and (max_steps is None or len(accepts) < max_steps):
        tree = build_tree(draft_at(pair, seq, hidden, root), seq[:, root], budget=budget, topk_cap=topk_cap)
        accepted = int(walk_along(tree, seq, root).accept_len[0])
        accepts.append(accepted)
        emitted += accepted + 1
        root += accepted + 1
    return accepts


@dataclass(frozen=True)
class PolicyStep:
    option: str          # what the step verified (ddtree.width_policy.Option.name)
    width: int           # its tokens through the target
    accepted: int        # draft tokens it accepted


@torch.no_grad()
def offline_policy_steps(pair: Pair, prompt: list[int], continuation: list[int], policy: WidthPolicy,
                         max_steps: int, first: int | None = None) -> list[PolicyStep]:
    """offline_accept_lengths with the width chosen per step by `policy` (issue 70): each step verifies the option
    the previous step planned (`first`, default the chain or the narrowest option, for the first step), builds the
    widest tree of its draft for the next plan, and feeds the policy's calibration what the verified tree accepted.
    One request (batch 1) along the target's greedy continuation."""
    depth = pair.block_size - 1
    seq, hidden = walk_inputs(pair, prompt, continuation, max_steps * (depth + 1) + depth + 1)
    names = [o.name for o in policy.options]
    chosen = first if first is not None else (names.index("chain") if "chain" in names else 0)
    root, steps = len(prompt) - 1, []
    while len(steps) < max_steps:
        draft = draft_at(pair, seq, hidden, root)                                      # [1, L, V]
        option = policy.options[chosen]
        accepted = 0
        if option.budget > 0:
            tree = build_tree(draft, seq[:, root], budget=option.budget, topk_cap=option.cap)
            verdict = walk_along(tree, seq, root)
            accepted = int(verdict.accept_len[0])
            if policy.calibration is not None:
                policy.calibration.update(tree, verdict.accept_len)
        steps.append(PolicyStep(option.name, option.width, accepted))
        chosen = int(policy.plan_from_draft(draft, seq[:, root], batch=1))
        root += accepted + 1
    return steps


def modelled_tokens_per_s(steps: list[PolicyStep], cost_ms) -> float:
    """Tokens over the modelled time of their steps: sum(accepted + 1) / sum(cost_ms(width)) x 1000."""
    return 1000 * sum(s.accepted + 1 for s in steps) / sum(cost_ms(s.width) for s in steps)
