"""DraftTree + target logits -> Verdict (lossless greedy and sample-and-match verification).

Stages (one function each):
  target_probs      target logits -> the distribution the engine samples from (temperature,
                    then top-k, top-p, min-p: SGLang's order, each step renormalised)
  node_targets      one token per node: argmax (temperature 0) or one sample (temperature > 0)
  walk_tree         from the root, follow the child whose token equals the current node's
                    target token; the target token at the last accepted node is the bonus
                    (accept_path: the same stage for targets chosen elsewhere, e.g. rank 0's)

Why this is lossless: the tree is a deterministic function of the context, and the token
emitted after an accepted node is a sample from the target at exactly that node's context, so
the emitted sequence is distributed as plain sampling from the target. Rejection schemes that
use the draft's q (SpecInfer, SpecTr) are not lossless for a deterministic top-K tree.

No host synchronisation and no branching on tensor values after the argument checks; samples
come from exponential races (argmax p_i / E_i, E_i ~ Exp(1)), which need no cumulative sums.
"""

from __future__ import annotations

import torch

from ddtree import _checks
from ddtree.backend import kernels, resolve_backend
from ddtree.types import DraftTree, SamplingParams, Verdict


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                 top_p: torch.Tensor | None, min_p: torch.Tensor | None) -> torch.Tensor:
    """The sampling distribution, float32 [R, V], from logits [R, V] and per-row params [R].

    temperature -> softmax -> top-k (keep the k most likely, renormalise) -> top-p (keep the
    shortest most-likely prefix whose mass reaches p, renormalise) -> min-p (drop tokens below
    min_p * max prob, renormalise). Rows with temperature 0 are computed at temperature 1 here;
    node_targets takes their argmax instead.
    """
    t = torch.where(temperature > 0, temperature, 1.0).float()[:, None]  # [R, 1]
    probs = torch.softmax(logits.float() / t, dim=-1)                        # [R, V]
    if top_k is not None or top_p is not None:
        probs = _top_k_top_p(probs, top_k, top_p)
    if min_p is not None:
        floor = probs.amax(dim=-1, keepdim=True) * min_p.float()[:, None]
        probs = torch.where(probs >= floor, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor | None,
                 top_p: torch.Tensor | None) -> torch.Tensor:
    """Top-k then top-p on sorted probabilities; probs float32 [R, V] -> [R, V]."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)      # [R, V]
    rank = torch.arange(probs.shape[-1], device=probs.device)               # [V]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
        sorted_p = torch.where(rank < k, sorted_p, 0.0)
        sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
    if top_p is not None:
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p            # exclusive prefix mass
        sorted_p = torch.where(mass_before < top_p.float()[:, None], sorted_p, 0.0)
        sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def sample_no_sync(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from probs [R, V] by an exponential race; int64 [R]; no host sync."""
    race = torch.empty_like(probs).exponential_(generator=generator).clamp_(min=1e-30)
    return (probs / race).argmax(dim=-1)


def node_targets(target_logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None, backend: str = "torch") -> torch.Tensor:
    """The target's token at every node: argmax if temperature 0, else a sample. int64 [bs, N]."""
    bs, n, vocab = target_logits.shape
    if backend == "triton":
        greedy = kernels().argmax_rows(target_logits)                          # [bs, N]
    else:
        greedy = target_logits.argmax(dim=-1)                                # [bs, N]
    if params.all_greedy:
        return greedy
    rows = target_logits.reshape(bs * n, vocab)

    def per_node(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[:, None].expand(bs, n).reshape(bs * n)

    probs = target_probs(rows, per_node(params.temperature), per_node(params.top_k),
                         per_node(params.top_p), per_node(params.min_p))
    sampled = sample_no_sync(probs, generator).reshape(bs, n)
    return torch.where(params.temperature[:, None] > 0, sampled, greedy)


def walk_tree(tree: DraftTree, targets: torch.Tensor) -> Verdict:
    """Accept the path whose every token equals the target token at its parent.

    targets int64 [bs, N]. Siblings hold distinct tokens, so at most one child matches at each
    step and the accepted nodes form one path from the root.
    """
    bs, n = tree.tokens.shape
    max_depth = tree.max_depth
    dev = tree.tokens.device
    parent_target = targets.gather(1, tree.parents.clamp(min=0))             # [bs, N]
    matches = (tree.tokens == parent_target) & (tree.parents >= 0)
    matches[:, 0] = True                                                     # the root is given
    # a node is accepted iff it and all its ancestors match
    accepted_node = ~(tree.ancestor_mask & ~matches[:, None, :]).any(dim=-1)  # [bs, N]
    accept_len = accepted_node.sum(dim=1) - 1                                # [bs]
    slot = torch.where(accepted_node, tree.depths, max_depth + 1)            # depth -> path slot
    ix = torch.arange(n, device=dev).expand(bs, n)
    accepted = torch.full((bs, max_depth + 2), -1, dtype=torch.int64, device=dev)
    accepted.scatter_(1, slot, ix)
    accepted = accepted[:, : max_depth + 1]                                  # [bs, L+1]
    last = accepted.gather(1, accept_len[:, None])                           # [bs, 1]
    bonus = targets.gather(1, last).squeeze(1)                               # [bs]
    # tokens: accepted draft tokens (nodes 1..accept_len of the path), then the bonus
    path_tokens = tree.tokens.gather(1, accepted[:, 1:].clamp(min=0))        # [bs, L]
    step = torch.arange(max_depth + 1, device=dev)[None, :]                  # [1, L+1]
    out = torch.cat([path_tokens, torch.zeros_like(bonus)[:, None]], dim=1)
    out = torch.where(step < accept_len[:, None], out, -1)
    out = torch.where(step == accept_len[:, None], bonus[:, None], out)
    return Verdict(accepted=accepted, accept_len=accept_len, bonus=bonus, tokens=out)


def _sampling_params(target_logits: torch.Tensor, temperature, top_p, top_k, min_p) -> SamplingParams:
    bs = target_logits.shape[0]
    dev = target_logits.device
    temp = _checks.per_request("temperature", temperature, bs, dev, torch.float32)
    _checks.check_range("temperature", temperature, temp, 0.0, float("inf"), False, True,
                        "expected a finite temperature >= 0 (0 = greedy)")
    tp = tk = mp = None
    if top_p is not None:
        tp = _checks.per_request("top_p", top_p, bs, dev, torch.float32)
        _checks.check_range("top_p", top_p, tp, 0.0, 1.0, True, False, "expected 0 < top_p <= 1 (1 = off)")
    if top_k is not None:
        if isinstance(top_k, torch.Tensor) and top_k.is_floating_point():
            raise _checks.fail("top_k.dtype", top_k.dtype, "expected integer top_k (<= 0 = off)")
        if isinstance(top_k, float):
            raise _checks.fail("top_k", top_k, "expected an integer (<= 0 = off)")
        tk = _checks.per_request("top_k", top_k, bs, dev, torch.int64)
    if min_p is not None:
        mp = _checks.per_request("min_p", min_p, bs, dev, torch.float32)
        _checks.check_range("min_p", min_p, mp, 0.0, 1.0, False, True, "expected 0 <= min_p < 1 (0 = off)")
    all_greedy = not isinstance(temperature, torch.Tensor) and float(temperature) == 0.0
    return SamplingParams(temperature=temp, top_k=tk, top_p=tp, min_p=mp, all_greedy=all_greedy)


def _check_verify_args(tree: DraftTree, target_logits: torch.Tensor) -> None:
    if not isinstance(tree, DraftTree):
        raise _checks.fail("tree", type(tree).__name__, "expected the DraftTree returned by build_tree")
    _checks.check_float_logits("target_logits", target_logits, 3)
    bs, n = tree.tokens.shape
    if target_logits.shape[:2] != (bs, n):
        raise _checks.fail("target_logits.shape", tuple(target_logits.shape),
                           f"expected [{bs}, {n}, V]: one row per tree node (budget + 1)")
    if target_logits.shape[2] == 0:
        raise _checks.fail("target_logits.shape", tuple(target_logits.shape), "vocabulary must be non-empty")
    if target_logits.device != tree.tokens.device:
        raise _checks.fail("target_logits.device", str(target_logits.device),
                           f"expected {tree.tokens.device} (the tree's device)")
    _checks.check_no_nan("target_logits", target_logits)


def verify_tree(tree: DraftTree, target_logits: torch.Tensor, temperature, top_p=None, top_k=None,
                min_p=None, generator: torch.Generator | None = None, backend: str | None = None) -> Verdict:
    """Verify a batch of draft trees against the target.

    target_logits [bs, N, V]: row i = the target's logits for the token after node i's path.
    temperature float [bs] (0 = greedy) or one Python number for the batch (0 skips sampling
    entirely); top_p float [bs] (1 = off); top_k int64 [bs] (<= 0 = off); min_p float [bs]
    (0 = off); None turns a filter off for the whole batch. Greedy and sampled requests may mix.
    backend: as for build_tree (Triton argmax and walk on CUDA); both give identical verdicts.
    """
    _check_verify_args(tree, target_logits)
    params = _sampling_params(target_logits, temperature, top_p, top_k, min_p)
    chosen = resolve_backend(backend, target_logits.device)
    return accept_path(tree, node_targets(target_logits, params, generator, chosen), backend=chosen)


def accept_path(tree: DraftTree, targets: torch.Tensor, backend: str | None = None) -> Verdict:
    """The walk stage alone: targets int64 [bs, N] = the target's token at every node (its argmax,
    or one sample from its processed distribution, as node_targets chooses).

    A tensor-parallel server chooses the targets on every rank, broadcasts rank 0's and calls this
    on each rank, so that every rank commits the same verdict.
    """
    if not isinstance(tree, DraftTree):
        raise _checks.fail("tree", type(tree).__name__, "expected the DraftTree returned by build_tree")
    if targets.shape != tree.tokens.shape:
        raise _checks.fail("targets.shape", tuple(targets.shape),
                           f"expected {tuple(tree.tokens.shape)}: one token per tree node")
    if targets.dtype != torch.int64:
        raise _checks.fail("targets.dtype", targets.dtype, "expected int64 token ids")
    if resolve_backend(backend, targets.device) == "triton":
        return kernels().walk(tree, targets)
    return walk_tree(tree, targets)
