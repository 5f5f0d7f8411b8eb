"""SGLang's EAGLE tree format for a DraftTree and a Verdict: what SGLang's own tree kernels read and write.
The plugin does not use it (its verify pass takes the FULL_MASK and positions, ddtree.sglang.step.glue); the unit tests
hold the tree and the verdict to this layout, as SGLang's tree builders fill it (test-only, out of src: issue 46).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.sglang.step.glue import full_mask
from ddtree.types import DraftTree, Verdict


@dataclass(frozen=True)
class VerifyInputs:
    draft_tokens: torch.Tensor          # int64 [bs*N]
    positions: torch.Tensor             # int64 [bs*N]  prefix length + depth
    custom_mask: torch.Tensor           # bool [sum_b (prefix_b + N) * N]
    retrive_index: torch.Tensor         # int64 [bs, N]
    retrive_next_token: torch.Tensor    # int64 [bs, N]
    retrive_next_sibling: torch.Tensor  # int64 [bs, N]
    draft_token_num: int                # N = budget + 1


@dataclass(frozen=True)
class AcceptResult:
    accept_index: torch.Tensor   # int64 [bs, L+1]  flat b*N + node of the accepted path, root first, -1 padded
    accept_length: torch.Tensor  # int64 [bs]       accepted draft tokens (the bonus not counted)
    predict: torch.Tensor        # int64 [bs*N]     target token after each accepted node; 0 elsewhere


def eagle_layout(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's EAGLE tree layout of a DraftTree, each int64 [bs, N].

    retrive_index[b, i] = b * N + i (padding too, as SGLang's own tree builders fill it);
    retrive_next_token[b, i] = first child of i (the best-scoring one) or -1;
    retrive_next_sibling[b, i] = the next child of i's parent in node order (= decreasing score), or -1.
    """
    bs, n = tree.parents.shape
    dev = tree.parents.device
    ix = torch.arange(n, device=dev).expand(bs, n)                 # [bs, N]
    has_parent = tree.parents >= 0
    # first child: smallest child index per parent (column n collects root/padding)
    first = torch.full((bs, n + 1), n, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, torch.where(has_parent, tree.parents, n), ix, reduce="amin")
    next_token = torch.where(first[:, :n] < n, first[:, :n], -1)
    # next sibling: order nodes by (parent, index); a neighbour with the same parent is the sibling
    key = torch.where(has_parent, tree.parents * n + ix, n * n + ix)
    order = key.argsort(dim=1)                                     # [bs, N]
    par_sorted = tree.parents.gather(1, order)
    same = (par_sorted[:, 1:] == par_sorted[:, :-1]) & (par_sorted[:, :-1] >= 0)  # [bs, N-1]
    succ = torch.where(same, order[:, 1:], -1)
    next_sibling = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
    next_sibling.scatter_(1, order[:, :-1], succ)
    retrive_index = torch.arange(bs, device=dev)[:, None] * n + ix   # padding is never reached by a walk
    return retrive_index, next_token, next_sibling


def verify_inputs(tree: DraftTree, prefix_lens: torch.Tensor, prefix_lens_cpu: list[int]) -> VerifyInputs:
    """prefix_lens: tokens already in the KV cache per request (the root is at that position)."""
    bs, n = tree.tokens.shape
    total = sum((p + n) * n for p in prefix_lens_cpu)
    index, next_token, next_sibling = eagle_layout(tree)
    return VerifyInputs(draft_tokens=tree.tokens.reshape(-1), positions=tree.positions(prefix_lens).reshape(-1),
                        custom_mask=full_mask(tree, prefix_lens, total), retrive_index=index,
                        retrive_next_token=next_token, retrive_next_sibling=next_sibling, draft_token_num=n)


def accept_from_verdict(verdict: Verdict, width: int) -> AcceptResult:
    """Map a Verdict to SGLang's accept outputs for a tree of width N."""
    bs, steps = verdict.accepted.shape
    dev = verdict.accepted.device
    base = torch.arange(bs, device=dev)[:, None] * width
    index = torch.where(verdict.accepted >= 0, base + verdict.accepted, -1)      # [bs, L+1]
    predict = torch.zeros(bs * width, dtype=torch.int64, device=dev)
    live = index >= 0
    # the token emitted after accepted node j is verdict.tokens[:, j] (draft token j+1, or the bonus)
    predict[index[live]] = verdict.tokens[live]
    return AcceptResult(accept_index=index, accept_length=verdict.accept_len, predict=predict)
