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

import os
from dataclasses import dataclass
from functools import lru_cache

import torch

from ddtree import _checks

MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Candidates:
    """Top-K draft candidates per depth, best first (ties: smaller token id first)."""

    logp: torch.Tensor    # float32 [bs, L, K]  log q_d(token); -inf = no candidate
    tokens: torch.Tensor  # int64   [bs, L, K]


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


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees of width N = budget + 1 (node 0 = root = last verified token).

    Valid nodes come first; each parent precedes its children; siblings in decreasing score.
    Padding nodes carry the root's token (so a verify pass can embed them), parent -1, depth -1,
    score -inf, and attend to themselves only.
    """

    tokens: torch.Tensor         # int64 [bs, N]
    parents: torch.Tensor        # int64 [bs, N]   -1 for the root and for padding
    depths: torch.Tensor         # int64 [bs, N]   0 root, 1..L nodes, -1 padding
    scores: torch.Tensor         # float32 [bs, N] 0 root, -inf padding
    num_nodes: torch.Tensor      # int64 [bs]      valid nodes including the root
    ancestor_mask: torch.Tensor  # bool [bs, N, N] row i: i and its ancestors
    max_depth: int               # L

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def positions(self, root_positions: torch.Tensor) -> torch.Tensor:
        """Sequence positions of the nodes: root position + depth (padding: root position).

        root_positions int64 [bs] -> int64 [bs, N]. Example: depths [0, 1, 1, 2, -1] and root
        position 7 give [7, 8, 8, 9, 7].
        """
        if root_positions.shape != (self.batch_size,):
            raise _checks.fail("root_positions.shape", tuple(root_positions.shape),
                               f"expected [{self.batch_size}]")
        return root_positions.to(torch.int64)[:, None] + self.depths.clamp(min=0)

    def eagle_layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SGLang's EAGLE tree layout, each int64 [bs, N].

        retrive_index[b, i] = b * N + i (padding too, as SGLang's own tree builders fill it);
        retrive_next_token[b, i] = first child of i (the best-scoring one) or -1;
        retrive_next_sibling[b, i] = the next child of i's parent in node order, or -1.
        """
        return eagle_layout(self)


@lru_cache(maxsize=256)
def _pair_lists(w_prev: int, k: int, budget: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Static (parent slot, child rank) pairs that can reach the top `budget`: (i+1)(j+1) <= budget."""
    ii: list[int] = []
    jj: list[int] = []
    for i in range(w_prev):
        for j in range(k):
            if (i + 1) * (j + 1) > budget:
                break
            ii.append(i)
            jj.append(j)
    return tuple(ii), tuple(jj)


_PAIR_TENSORS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def level_pairs(w_prev: int, k: int, budget: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair index tensors (int64 [P] each) on `device`, cached; built on the host outside capture."""
    key = (w_prev, k, budget, str(device))
    hit = _PAIR_TENSORS.get(key)
    if hit is not None:
        return hit
    ii, jj = _pair_lists(w_prev, k, budget)
    pair = (torch.tensor(ii, dtype=torch.int64).to(device), torch.tensor(jj, dtype=torch.int64).to(device))
    _PAIR_TENSORS[key] = pair
    return pair


def order_key(score: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """int64 key sorting by score descending, then index ascending (index < 2**32).

    The float32 bits are mapped to an int whose signed order is the float order (-0.0 folded
    into 0.0, -inf the smallest).
    """
    bits = (score.float() + 0.0).contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered << 32) | (MASK32 - index)


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


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """'triton' on CUDA when Triton imports, else 'torch'; DDTREE_BACKEND or `backend` overrides."""
    choice = backend or os.environ.get("DDTREE_BACKEND") or "auto"
    if choice not in ("auto", "torch", "triton"):
        raise _checks.fail("backend", choice, "expected 'auto', 'torch' or 'triton' (also DDTREE_BACKEND)")
    if choice == "auto":
        if device.type != "cuda":
            return "torch"
        from ddtree import _triton  # only imported on the GPU path

        return "triton" if _triton.available() else "torch"
    return choice


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


def eagle_layout(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See DraftTree.eagle_layout. Siblings are chained in node order (= decreasing score)."""
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


def draft_candidates(draft_logits: torch.Tensor, k: int, backend: str | None = None) -> Candidates:
    """[bs, L, V] draft logits -> Candidates with K = k (fused Triton pass on CUDA, else torch)."""
    if resolve_backend(backend, draft_logits.device) == "triton":
        from ddtree import _triton

        return _triton.draft_candidates(draft_logits, k)
    return draft_candidates_torch(draft_logits, k)


def build_tree_from_candidates(cand: Candidates, root_tokens: torch.Tensor, budget: int,
                               backend: str | None = None) -> DraftTree:
    """The tree stages after candidate extraction (e.g. candidates merged across TP ranks).

    cand: K = min(topk_cap, budget, V) candidates per depth, best first (see Candidates).
    """
    _checks.check_positive_int("budget", budget)
    if resolve_backend(backend, cand.logp.device) == "triton":
        from ddtree import _triton

        return _triton.build_tree(cand, root_tokens, budget)
    levels = expand_levels(cand, budget)
    sel = select_nodes(levels, budget)
    return assemble_tree(levels, sel, root_tokens)
