"""Sampling penalties at every node of a DDTree, each node with the counts of its own path (issue 33).

A plain decoder applies, before choosing the token after output o_1..o_k: frequency (minus
frequency x the token's count in the output), presence (minus presence for a token in the output),
repetition (a token in the output: its logit divided by the penalty if positive, multiplied if
negative) and min_new_tokens (the stop tokens at -inf while k < min_new_tokens) - SGLang 0.5.23's
penalizers, additive ones first, then the scaling one, as its overlap scheduler and its speculative
path apply them (its non-overlap NONE path applies them in a set's iteration order, not fixed: with
repetition combined with another penalty NONE itself differs between overlap on and off). A
tree node's logits predict the token after (output so far) + (the node's path below the root), so
each node gets the penalties of that longer output: the batch's state as of the root plus its own
path's tokens. No [bs, N, V] tensor beyond the logits is built: the state is broadcast over the
nodes, and the path's corrections are scattered at (node, path token) pairs (at most N per node).
No host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.types import DraftTree


@dataclass
class PenaltyState:
    """A batch's penalties as of each request's tree root (the output so far, whatever it includes).

    additive: float32 [bs, V] or None  what frequency and presence add for the output so far (<= 0)
    scaling:  float32 [bs, V] or None  repetition's factor per token for the output so far (1: none)
    frequency, presence: float32 [bs]  per request (0: off)
    repetition: float32 [bs]           per request (1: off)
    seen: bool [bs, V]                 the token is in the output so far
    out_len: int64 [bs]                output tokens so far; min_new_tokens: int64 [bs] (0: off)
    stop: bool [bs, V] or None         the tokens min_new_tokens holds back
    """

    additive: torch.Tensor | None
    scaling: torch.Tensor | None
    frequency: torch.Tensor
    presence: torch.Tensor
    repetition: torch.Tensor
    seen: torch.Tensor
    out_len: torch.Tensor
    min_new_tokens: torch.Tensor
    stop: torch.Tensor | None


@dataclass
class PathPairs:
    """(node j, node i) pairs with i on j's path below the root, and the flat index of (j, token of i)."""

    on_path: torch.Tensor      # bool [bs, N, N]   i is an ancestor-or-self of j with depth >= 1
    first: torch.Tensor        # bool [bs, N, N]   ... and the first such i with its token
    token_on_path: torch.Tensor  # bool [bs, N, N] the token of i appears on j's path (any i is fine)
    index: torch.Tensor        # int64 [bs, N * N] j * V + token(i), into logits viewed [bs, N * V]


def path_pairs(tree: DraftTree, vocab: int) -> PathPairs:
    bs, n = tree.tokens.shape
    tokens = tree.tokens.clamp(min=0)                                             # [bs, N] padding -> 0
    on_path = tree.ancestor_mask & (tree.depths > 0)[:, None, :]                  # [bs, N(j), N(i)]
    same = tokens[:, :, None] == tokens[:, None, :]                               # [bs, N(i), N(i')]
    earlier = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(-1)    # i' < i
    # a duplicate: some earlier i' on j's path with the same token
    dup = torch.einsum("bjk,bik->bji", on_path.float(), (same & earlier).float()) > 0
    token_on_path = torch.einsum("bjk,bik->bji", on_path.float(), same.float()) > 0
    index = torch.arange(n, device=tokens.device)[None, :, None] * vocab + tokens[:, None, :]
    return PathPairs(on_path, on_path & ~dup, token_on_path, index.reshape(bs, n * n))


def apply_node_penalties(rows: torch.Tensor, tree: DraftTree, state: PenaltyState) -> None:
    """Penalise the target's logits at every node in place. rows float [bs, N, V]."""
    bs, n, vocab = rows.shape
    pairs = path_pairs(tree, vocab)
    _additive(rows, pairs, state)
    _min_new_tokens(rows, tree, state)
    _scaling(rows, pairs, state)


def _additive(rows: torch.Tensor, pairs: PathPairs, state: PenaltyState) -> None:
    """Frequency per occurrence on the path; presence once per path token not yet in the output."""
    bs, n, vocab = rows.shape
    if state.additive is not None:
        rows.add_(state.additive[:, None, :])
    flat = rows.view(bs, n * vocab)
    unseen = ~state.seen.gather(1, pairs.index.view(bs, n, n)[:, 0, :])          # [bs, N(i)] token(i) not out yet
    per_pair = (-state.frequency[:, None, None] * pairs.on_path
                - state.presence[:, None, None] * (pairs.first & unseen[:, None, :]))   # [bs, N, N]
    flat.scatter_add_(1, pairs.index, per_pair.reshape(bs, n * n).to(rows.dtype))


def _min_new_tokens(rows: torch.Tensor, tree: DraftTree, state: PenaltyState) -> None:
    """The stop tokens at -inf at nodes whose output (so far + path) is still below min_new_tokens."""
    if state.stop is None:
        return
    held = (state.out_len[:, None] + tree.depths.clamp(min=0)) < state.min_new_tokens[:, None]   # [bs, N]
    rows.masked_fill_(held[:, :, None] & state.stop[:, None, :], float("-inf"))


def _scaling(rows: torch.Tensor, pairs: PathPairs, state: PenaltyState) -> None:
    """Repetition: the output so far's factors, then each path token not yet out gets the request's."""
    bs, n, vocab = rows.shape
    if state.scaling is not None:
        factor = state.scaling[:, None, :]
        rows.copy_(torch.where(rows < 0, rows * factor, rows / factor))
    flat = rows.view(bs, n * vocab)
    values = flat.gather(1, pairs.index).view(bs, n, n)                           # [bs, N(j), N(i)]
    unseen = ~state.seen.gather(1, pairs.index.view(bs, n, n)[:, 0, :])
    rep = state.repetition[:, None, None].to(rows.dtype)
    scaled = torch.where(values < 0, values * rep, values / rep)
    # every pair that names (j, t) writes the same value: scaled iff t is on j's path and not yet out
    new = pairs.token_on_path & unseen[:, None, :]
    flat.scatter_(1, pairs.index, torch.where(new, scaled, values).reshape(bs, n * n))
