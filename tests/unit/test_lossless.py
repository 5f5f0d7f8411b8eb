"""Losslessness: speculative decoding with DDTree emits exactly the target's distribution.

Exact: enumerate every joint draw of node tokens (through the real walk_tree) on a tiny
vocabulary and compare the distribution of the first T emitted tokens with autoregressive
sampling. Statistical: run the real build_tree + verify_tree loop for >= 100,000 requests in
parallel with top-k / top-p / min-p on, and compare with a chi-square test; a control run that
samples at the wrong temperature must fail the same test (the test has power).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import torch

from ddtree import build_tree, verify_tree
from ddtree.verify import target_probs, walk_tree

from ..helpers import chi_square_pvalue as _chi
from .toy import ToyPair, fold, fold_py


def chi_square_pvalue(samples: torch.Tensor, want: dict[tuple, float]) -> float:
    return _chi(map(tuple, samples.tolist()), want)


def ar_distribution(pair: ToyPair, ctx_hash: int, length: int, params: dict) -> dict[tuple, float]:
    """P(first `length` tokens) under plain autoregressive sampling from the processed target."""
    out: dict[tuple, float] = {}

    def rec(h: int, prefix: tuple, prob: float) -> None:
        if len(prefix) == length:
            out[prefix] = out.get(prefix, 0.0) + prob
            return
        p = processed(pair.target[h][None], params)[0]
        for t, pt in enumerate(p.tolist()):
            if pt > 0:
                rec(fold_py(h, t), prefix + (t,), prob * pt)

    rec(ctx_hash, (), 1.0)
    return out


def processed(logits: torch.Tensor, params: dict) -> torch.Tensor:
    r = logits.shape[0]
    p = target_probs(logits, torch.full((r,), params["temperature"]),
                        None if params.get("top_k") is None else torch.full((r,), params["top_k"]),
                        None if params.get("top_p") is None else torch.full((r,), params["top_p"]),
                        None if params.get("min_p") is None else torch.full((r,), params["min_p"]))
    p = p.double()  # exact bookkeeping: renormalise the float32 rows in float64
    return p / p.sum(dim=-1, keepdim=True)


def spec_distribution(pair: ToyPair, ctx_hash: int, root: int, length: int, budget: int, cap: int,
                      params: dict) -> dict[tuple, float]:
    """P(first `length` emitted tokens) under DDTree rounds, by enumerating node draws exactly."""
    out: dict[tuple, float] = defaultdict(float)

    def rec(h: int, root_tok: int, prefix: tuple, prob: float) -> None:
        if len(prefix) >= length:
            out[prefix[:length]] += prob
            return
        tree = build_tree(pair.draft[h][None], torch.tensor([root_tok]), budget=budget, topk_cap=cap)
        n_valid = int(tree.num_nodes[0])
        node_h = pair.node_hashes(tree, torch.tensor([h]))[0, :n_valid]
        probs = processed(pair.target[node_h], params)                # [n, V]
        vocab = probs.shape[1]
        draws = torch.tensor(list(itertools.product(range(vocab), repeat=n_valid)))  # [V^n, n]
        weight = probs.gather(1, draws.T).prod(dim=0)                           # [V^n]
        keep = weight > 0
        draws, weight = draws[keep], weight[keep]
        rows = draws.shape[0]
        width = tree.width
        targets = torch.zeros(rows, width, dtype=torch.int64)
        targets[:, :n_valid] = draws
        batch = type(tree)(tokens=tree.tokens.expand(rows, -1), parents=tree.parents.expand(rows, -1),
                           depths=tree.depths.expand(rows, -1), scores=tree.scores.expand(rows, -1),
                           num_nodes=tree.num_nodes.expand(rows),
                           ancestor_mask=tree.ancestor_mask.expand(rows, -1, -1), max_depth=tree.max_depth)
        verdict = walk_tree(batch, targets)
        emitted: dict[tuple, float] = defaultdict(float)
        for toks, n_acc, w in zip(verdict.tokens.tolist(), verdict.accept_len.tolist(), weight.tolist()):
            emitted[tuple(toks[: n_acc + 1])] += w
        for seq, w in emitted.items():
            h2 = h
            for t in seq:
                h2 = fold_py(h2, t)
            rec(h2, seq[-1], prefix + seq, prob * w)

    rec(ctx_hash, root, (), 1.0)
    return dict(out)


EXACT_CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=2),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.2),
    dict(temperature=1.0, top_k=2, top_p=0.9, min_p=0.1),
]


@pytest.mark.parametrize("params", EXACT_CASES)
@pytest.mark.parametrize("budget,cap", [(3, 2), (4, 3), (2, 1)])
def test_exact_distribution_equals_autoregressive(params, budget, cap):
    pair = ToyPair.make(vocab=3, max_depth=2, seed=budget * 10 + cap, scale=1.5)
    root = 1
    ctx = fold_py(17, root)
    want = ar_distribution(pair, ctx, 3, params)
    got = spec_distribution(pair, ctx, root, 3, budget, cap, params)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    for seq in set(want) | set(got):
        assert got.get(seq, 0.0) == pytest.approx(want.get(seq, 0.0), abs=1e-9), seq


def simulate(pair: ToyPair, rows: int, length: int, budget: int, cap: int, params: dict,
             seed: int) -> torch.Tensor:
    """Run the real speculative loop for `rows` requests until each emitted `length` tokens."""
    g = torch.Generator().manual_seed(seed)
    root = torch.ones(rows, dtype=torch.int64)
    h = fold(torch.full((rows,), 17), root)
    out = torch.full((rows, length), -1, dtype=torch.int64)
    count = torch.zeros(rows, dtype=torch.int64)
    temp = torch.full((rows,), params["temperature"])
    opt = {k: torch.full((rows,), params[k]) for k in ("top_k", "top_p", "min_p") if params.get(k) is not None}
    for _ in range(length):  # each round emits at least one token
        tree = build_tree(pair.draft[h], root, budget=budget, topk_cap=cap)
        logits = pair.target[pair.node_hashes(tree, h)]                         # [rows, N, V]
        v = verify_tree(tree, logits, temp, generator=g, **opt)
        for j in range(tree.max_depth + 1):
            tok = v.tokens[:, j]
            active = (j <= v.accept_len) & (count < length)
            out[active, count[active]] = tok[active]
            h = torch.where(active, fold(h, tok), h)
            count += active.long()
        root = v.bonus
    assert (count == length).all()
    return out


STAT_PARAMS = dict(temperature=0.8, top_k=3, top_p=0.9, min_p=0.05)


def test_sampled_sequences_match_autoregressive_chi_square():
    pair = ToyPair.make(vocab=4, max_depth=3, seed=5, scale=1.2)
    want = ar_distribution(pair, fold_py(17, 1), 4, STAT_PARAMS)
    samples = simulate(pair, 120_000, 4, budget=6, cap=3, params=STAT_PARAMS, seed=1)
    assert chi_square_pvalue(samples, want) > 1e-3


def test_chi_square_detects_a_lossy_sampler():
    """Control: sampling at temperature 0.9 while claiming 0.8 (same support) must be rejected."""
    pair = ToyPair.make(vocab=4, max_depth=3, seed=5, scale=1.2)
    want = ar_distribution(pair, fold_py(17, 1), 4, dict(temperature=0.8))
    samples = simulate(pair, 120_000, 4, budget=6, cap=3, params=dict(temperature=0.9), seed=1)
    assert chi_square_pvalue(samples, want) < 1e-6


def test_greedy_loop_equals_argmax_decoding():
    pair = ToyPair.make(vocab=5, max_depth=3, seed=9)
    out = simulate(pair, 4, 12, budget=8, cap=3, params=dict(temperature=0.0), seed=0)
    h = fold_py(17, 1)
    want = []
    for _ in range(12):
        t = int(pair.target[h].argmax())
        want.append(t)
        h = fold_py(h, t)
    assert out.tolist() == [want] * 4


def test_seeded_sampling_is_reproducible():
    pair = ToyPair.make(vocab=4, max_depth=3, seed=2)
    a = simulate(pair, 64, 6, budget=6, cap=3, params=STAT_PARAMS, seed=42)
    b = simulate(pair, 64, 6, budget=6, cap=3, params=STAT_PARAMS, seed=42)
    c = simulate(pair, 64, 6, budget=6, cap=3, params=STAT_PARAMS, seed=43)
    assert torch.equal(a, b) and not torch.equal(a, c)

