"""Draft logits -> DraftTree: the exact `budget` highest-scoring draft paths, batched.

Stages (one function each):
  draft_candidates  [bs, L, V] logits -> top-K tokens per depth and their log-probs
  expand_levels     per depth, the best `budget` paths of that depth (pruned pair expansion)
  select_nodes      the global best `budget` paths over all depths, ordered
  assemble_tree     tokens / parents / depths / scores / ancestor mask in the output order

Ordering and ties. Every comparison uses one total order: higher score first, ties broken by a
static index (candidates: smaller token id; paths of one depth: smaller (parent slot, child
rank); across depths: smaller depth). Scores are float32 sums of draft log-probs taken in depth
order. The order is encoded in int64 keys `(orderable score bits << 32) | (2^32 - 1 - index)` so
that one `topk` selects deterministically on CPU and GPU.

Why the level-by-level build is exact: a path that is not among the best `budget` paths of its
own depth has `budget` better paths before it, so it is not in the global best `budget`. Within a
depth, a child (parent slot i, child rank j) is beaten by every (i', j') with i' <= i, j' <= j,
i.e. by (i+1)(j+1) - 1 others, so only pairs with (i+1)(j+1) <= budget can be selected: about
budget * ln(budget) pairs per depth instead of budget * K.

Graph safety: after the argument checks nothing here synchronises with the host or branches on
tensor values; all shapes depend only on (bs, L, V, budget, topk_cap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree import _checks
from ddtree.backend import kernels, resolve_backend
from ddtree.types import MASK32, Candidates, DraftTree, level_pairs, order_key


@dataclass(frozen=True)
class Levels:
    """The best `budget` paths of each depth, in order (slot 0 best)."""

    scores: torch.Tensor       # float32 [bs, L, W]  path score; -inf = empty slot
    tokens: torch.Tensor       # int64   [bs, L, W]  last token of the path
    parent_slot: torch.Tensor  # int64   [bs, L, W]  slot of the parent path at depth d-1 (0 at depth 1 = root)


@dataclass(frozen=True)
class Selection:
    """The global best `budget` paths, in output order (node index = 1 + position)."""

    flat: torch.Tensor    # int64 [bs, budget]  index into Levels flattened as depth * W + slot
    scores: torch.Tensor  # float32 [bs, budget]
    valid: torch.Tensor   # bool [bs, budget]


def draft_candidates_torch(draft_logits: torch.Tensor, k: int) -> Candidates:
    """Reference candidate extraction in plain torch: [bs, L, V] -> Candidates with K = k."""
    x = draft_logits.float()                                       # [bs, L, V]
    log_z = torch.logsumexp(x, dim=-1, keepdim=True)               # [bs, L, 1]
    vocab = torch.arange(x.shape[-1], device=x.device)             # [V]
    top = order_key(x, vocab).topk(k, dim=-1).values               # [bs, L, K] best first
    tokens = MASK32 - (top & MASK32)                               # [bs, L, K]
    logit = x.gather(-1, tokens)
    logp = torch.where(torch.isfinite(logit), logit - log_z, float("-inf"))
    return Candidates(logp=logp, tokens=tokens)


def expand_levels(cand: Candidates, budget: int) -> Levels:
    """Depth by depth, keep the best `budget` paths (slot order = the total order)."""
    bs, max_depth, k = cand.logp.shape
    dev = cand.logp.device
    scores = torch.full((bs, max_depth, budget), float("-inf"), device=dev)
    tokens = torch.zeros((bs, max_depth, budget), dtype=torch.int64, device=dev)
    parent_slot = torch.zeros((bs, max_depth, budget), dtype=torch.int64, device=dev)
    prev = torch.zeros((bs, 1), device=dev)                        # [bs, w_prev] root score 0
    for d in range(max_depth):
        ii, jj = level_pairs(prev.shape[1], k, budget, dev)        # [P], [P]
        pair_score = prev[:, ii] + cand.logp[:, d, jj]             # [bs, P]
        w = min(budget, ii.shape[0])
        pick = order_key(pair_score, ii * k + jj).topk(w, dim=-1).indices  # [bs, w]
        scores[:, d, :w] = pair_score.gather(1, pick)
        parent_slot[:, d, :w] = ii[pick]
        tokens[:, d, :w] = cand.tokens[:, d].gather(1, jj[pick])
        prev = scores[:, d, :w]
    return Levels(scores=scores, tokens=tokens, parent_slot=parent_slot)


def select_nodes(levels: Levels, budget: int) -> Selection:
    """Global best `budget` over all depths; ties prefer the smaller depth, then the smaller slot."""
    bs, max_depth, w = levels.scores.shape
    flat_scores = levels.scores.reshape(bs, max_depth * w)         # [bs, L*W]
    index = torch.arange(max_depth * w, device=flat_scores.device)
    flat = order_key(flat_scores, index).topk(budget, dim=-1).indices  # [bs, budget]
    sel_scores = flat_scores.gather(1, flat)
    return Selection(flat=flat, scores=sel_scores, valid=sel_scores > float("-inf"))


def assemble_tree(levels: Levels, sel: Selection, root_tokens: torch.Tensor) -> DraftTree:
    """Write the selected paths as nodes 1..budget behind the root, with parents and mask."""
    bs, max_depth, w = levels.scores.shape
    budget = sel.flat.shape[1]
    n = budget + 1
    dev = sel.flat.device
    node_ix = torch.arange(1, n, device=dev).expand(bs, budget)    # [bs, budget] output index
    depth = torch.where(sel.valid, sel.flat // w + 1, -1)          # [bs, budget]
    tok = levels.tokens.reshape(bs, -1).gather(1, sel.flat)
    pslot = levels.parent_slot.reshape(bs, -1).gather(1, sel.flat)
    parent_flat = (depth - 2).clamp(min=0) * w + pslot             # parent's index in Levels
    # pos_of[b, flat] = output index of that path (extra column L*W soaks up invalid ones)
    pos_of = torch.full((bs, max_depth * w + 1), -1, dtype=torch.int64, device=dev)
    pos_of.scatter_(1, torch.where(sel.valid, sel.flat, max_depth * w), node_ix)
    parent = torch.where(depth > 1, pos_of.gather(1, parent_flat), 0)
    parent = torch.where(sel.valid, parent, -1)

    root = root_tokens.to(torch.int64)[:, None]                    # [bs, 1]
    tokens = torch.cat([root, torch.where(sel.valid, tok, root)], dim=1)
    parents = torch.cat([torch.full_like(root, -1), parent], dim=1)
    depths = torch.cat([torch.zeros_like(root), depth], dim=1)
    scores = torch.cat([torch.zeros((bs, 1), device=dev), sel.scores], dim=1)
    num_nodes = 1 + sel.valid.sum(dim=1)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores,
                     num_nodes=num_nodes, ancestor_mask=ancestor_mask(parents, max_depth),
                     max_depth=max_depth)


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """parents int64 [bs, N] -> bool [bs, N, N], row i True at i and all its ancestors."""
    bs, n = parents.shape
    self_ix = torch.arange(n, device=parents.device).expand(bs, n)  # [bs, N]
    chain = [self_ix]
    cur = parents
    for _ in range(max_depth):
        chain.append(torch.where(cur >= 0, cur, self_ix))
        cur = torch.where(cur >= 0, parents.gather(1, cur.clamp(min=0)), -1)
    anc = torch.stack(chain, dim=-1)                               # [bs, N, L+1]
    mask = torch.zeros((bs, n, n), dtype=torch.bool, device=parents.device)
    return mask.scatter_(2, anc, True)


def _check_build_args(draft_logits: torch.Tensor, root_tokens: torch.Tensor,
                      budget: int, topk_cap: int) -> None:
    _checks.check_positive_int("budget", budget)
    _checks.check_positive_int("topk_cap", topk_cap)
    _checks.check_float_logits("draft_logits", draft_logits, 3)
    bs, max_depth, vocab = draft_logits.shape
    if max_depth == 0:
        raise _checks.fail("draft_logits.shape", tuple(draft_logits.shape),
                           "L (dim 1) must be >= 1: one row of draft logits per depth")
    if vocab == 0 or bs == 0:
        raise _checks.fail("draft_logits.shape", tuple(draft_logits.shape), "batch and vocabulary must be non-empty")
    if budget >= 2**31 // max(1, max_depth):
        raise _checks.fail("budget", budget, f"budget * L must stay below 2**31 (L={max_depth})")
    if not isinstance(root_tokens, torch.Tensor):
        raise _checks.fail("root_tokens", type(root_tokens).__name__, f"expected an int64 tensor [{bs}]")
    if root_tokens.dtype not in (torch.int64, torch.int32):
        raise _checks.fail("root_tokens.dtype", root_tokens.dtype, "expected int64 token ids")
    if root_tokens.shape != (bs,):
        raise _checks.fail("root_tokens.shape", tuple(root_tokens.shape), f"expected [{bs}] (one per request)")
    if root_tokens.device != draft_logits.device:
        raise _checks.fail("root_tokens.device", str(root_tokens.device),
                           f"expected {draft_logits.device} (the draft logits' device)")
    _checks.check_no_nan("draft_logits", draft_logits)


def build_tree(draft_logits: torch.Tensor, root_tokens: torch.Tensor, *, budget: int,
               topk_cap: int, backend: str | None = None) -> DraftTree:
    """Build the DDTree of the `budget` best draft paths for each request.

    draft_logits float [bs, L, V]: row j = draft logits for depth j+1 (softmax at temperature 1).
    root_tokens int64 [bs]: the last verified token of each request.
    Returns a DraftTree of width budget + 1. budget = L with topk_cap = 1 is the DFlash chain.
    backend: None/'auto' (Triton kernels on CUDA, torch elsewhere), 'torch' or 'triton'; both
    give identical trees.
    """
    _check_build_args(draft_logits, root_tokens, budget, topk_cap)
    k = candidate_count(topk_cap, budget, draft_logits.shape[-1])
    chosen = resolve_backend(backend, draft_logits.device)
    return build_tree_from_candidates(draft_candidates(draft_logits, k, chosen), root_tokens, budget,
                                      backend=chosen)


def candidate_count(topk_cap: int, budget: int, vocab: int) -> int:
    """K, the candidates kept per depth: more than `budget` children never fit in the tree."""
    return min(topk_cap, budget, vocab)


def root_only_tree(roots: torch.Tensor, max_depth: int) -> DraftTree:
    """A tree of the root alone [bs, 1] (a step without speculation): its verify gives the target's next token and
    accepts nothing. roots int64 [bs]."""
    bs = roots.shape[0]
    zeros = torch.zeros((bs, 1), dtype=torch.int64, device=roots.device)
    return DraftTree(tokens=roots[:, None].to(torch.int64).clone(), parents=zeros - 1, depths=zeros,
                     scores=torch.zeros((bs, 1), dtype=torch.float32, device=roots.device),
                     num_nodes=torch.ones(bs, dtype=torch.int64, device=roots.device),
                     ancestor_mask=torch.ones((bs, 1, 1), dtype=torch.bool, device=roots.device), max_depth=max_depth)


def draft_candidates(draft_logits: torch.Tensor, k: int, backend: str | None = None) -> Candidates:
    """[bs, L, V] draft logits -> Candidates with K = k (fused Triton pass on CUDA, else torch)."""
    if resolve_backend(backend, draft_logits.device) == "triton":
        return kernels().draft_candidates(draft_logits, k)
    return draft_candidates_torch(draft_logits, k)


def build_tree_from_candidates(cand: Candidates, root_tokens: torch.Tensor, budget: int,
                               backend: str | None = None) -> DraftTree:
    """The tree stages after candidate extraction (e.g. candidates merged across TP ranks).

    cand: K = min(topk_cap, budget, V) candidates per depth, best first (see Candidates).
    """
    _checks.check_positive_int("budget", budget)
    if resolve_backend(backend, cand.logp.device) == "triton":
        return kernels().build_tree(cand, root_tokens, budget)
    levels = expand_levels(cand, budget)
    sel = select_nodes(levels, budget)
    return assemble_tree(levels, sel, root_tokens)
