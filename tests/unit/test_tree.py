"""build_tree: optimality against exhaustive enumeration, structure, layout, ties, chain."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ddtree import build_tree
from ddtree.tree import draft_candidates_torch
from tests.eagle_format import eagle_layout


def enumerate_paths(logits: torch.Tensor, cap: int) -> list[tuple[float, tuple[int, ...]]]:
    """All paths of length 1..L over the top-`cap` tokens of each row, with float64 scores."""
    logp = torch.log_softmax(logits.double(), dim=-1)  # [L, V]
    rows = []
    for row in logp:
        finite = [(float(v), t) for t, v in enumerate(row.tolist()) if v != -math.inf]
        finite.sort(key=lambda vt: (-vt[0], vt[1]))
        rows.append(finite[:cap])
    paths = []
    for depth in range(1, logits.shape[0] + 1):
        for combo in itertools.product(*rows[:depth]):
            paths.append((sum(v for v, _ in combo), tuple(t for _, t in combo)))
    return paths


def tree_paths(tree, b: int) -> list[tuple[float, tuple[int, ...]]]:
    """(score, token path) of each non-root valid node of request b, walking parents."""
    out = []
    n = int(tree.num_nodes[b])
    for i in range(1, n):
        path, j = [], i
        while j > 0:
            path.append(int(tree.tokens[b, j]))
            j = int(tree.parents[b, j])
        out.append((float(tree.scores[b, i]), tuple(reversed(path))))
    return out


CASES = [  # (V, L, cap, budget)
    (5, 3, 2, 4), (5, 3, 3, 9), (6, 4, 2, 20), (4, 3, 4, 100), (7, 2, 7, 30), (3, 4, 1, 4),
    (3, 4, 1, 2), (8, 3, 3, 1), (5, 4, 5, 17), (2, 5, 2, 62), (2, 5, 2, 80), (6, 3, 6, 40),
]


@pytest.mark.parametrize("vocab,max_depth,cap,budget", CASES)
def test_tree_is_the_exact_top_budget_paths(vocab, max_depth, cap, budget):
    for seed in range(25):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(1, max_depth, vocab, generator=g) * 3
        tree = build_tree(logits, torch.tensor([0]), budget=budget, topk_cap=cap)
        paths = sorted(enumerate_paths(logits[0], cap), key=lambda p: -p[0])
        want_n = min(budget, len(paths))
        assert int(tree.num_nodes[0]) == want_n + 1
        got = tree_paths(tree, 0)
        boundary_gap = paths[want_n - 1][0] - paths[want_n][0] if want_n < len(paths) else math.inf
        if boundary_gap > 1e-4:  # no near-tie at the cut: the set is unique
            assert {p for _, p in got} == {p for _, p in paths[:want_n]}
        got_scores = sorted((s for s, _ in got), reverse=True)
        want_scores = [s for s, _ in paths[:want_n]]
        assert got_scores == pytest.approx(want_scores, abs=1e-4)


def test_budget_larger_than_all_paths_pads_without_error():
    logits = torch.randn(2, 2, 3)
    tree = build_tree(logits, torch.tensor([1, 2]), budget=50, topk_cap=2)  # 2 + 4 = 6 paths
    assert tree.num_nodes.tolist() == [7, 7]
    assert (tree.depths[:, 7:] == -1).all() and (tree.parents[:, 7:] == -1).all()
    assert torch.isinf(tree.scores[:, 7:]).all()
    assert (tree.tokens[:, 7:] == tree.tokens[:, :1]).all()  # padding carries the root token


def random_tree(bs=4, max_depth=5, vocab=11, budget=24, cap=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, max_depth, vocab, generator=g) * 2
    roots = torch.randint(0, vocab, (bs,), generator=g)
    return logits, roots, build_tree(logits, roots, budget=budget, topk_cap=cap)


@pytest.mark.parametrize("seed", range(8))
def test_structure_order_and_ancestor_closure(seed):
    _, roots, tree = random_tree(seed=seed)
    assert tree.tokens.dtype == tree.parents.dtype == tree.depths.dtype == torch.int64
    assert tree.scores.dtype == torch.float32 and tree.ancestor_mask.dtype == torch.bool
    assert (tree.tokens[:, 0] == roots).all() and (tree.parents[:, 0] == -1).all()
    assert (tree.depths[:, 0] == 0).all() and (tree.scores[:, 0] == 0).all()
    for b in range(tree.batch_size):
        n = int(tree.num_nodes[b])
        for i in range(1, n):
            p = int(tree.parents[b, i])
            assert 0 <= p < i, "parent before child"
            assert int(tree.depths[b, i]) == int(tree.depths[b, p]) + 1
            assert float(tree.scores[b, i]) <= float(tree.scores[b, p])
        assert (tree.scores[b, 1:n].diff() <= 0).all(), "nodes in decreasing score"
        children = {}
        for i in range(1, n):
            children.setdefault(int(tree.parents[b, i]), []).append(i)
        for kids in children.values():
            toks = [int(tree.tokens[b, k]) for k in kids]
            assert len(set(toks)) == len(toks), "siblings hold distinct tokens"


@pytest.mark.parametrize("seed", range(4))
def test_ancestor_mask_equals_ancestor_relation(seed):
    _, _, tree = random_tree(seed=seed, budget=40, cap=8)
    bs, n = tree.tokens.shape
    for b in range(bs):
        want = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            want[i, i] = True
            j = int(tree.parents[b, i])
            while j >= 0:
                want[i, j] = True
                j = int(tree.parents[b, j])
        assert torch.equal(tree.ancestor_mask[b], want)


def test_positions_are_root_position_plus_depth():
    _, _, tree = random_tree(seed=3, budget=40, vocab=5, cap=3, max_depth=2)  # 3 + 9 paths: padding
    root_pos = torch.tensor([7, 0, 100, 3])
    pos = tree.positions(root_pos)
    valid = tree.depths >= 0
    assert torch.equal(pos[valid], (root_pos[:, None] + tree.depths)[valid])
    assert torch.equal(pos[~valid], root_pos[:, None].expand_as(pos)[~valid])
    with pytest.raises(ValueError, match="root_positions.shape"):
        tree.positions(torch.tensor([1, 2]))


@pytest.mark.parametrize("seed", range(6))
def test_eagle_layout_walk_reproduces_parents(seed):
    _, _, tree = random_tree(seed=seed, budget=30, cap=5, vocab=6, max_depth=3)
    index, next_token, next_sibling = eagle_layout(tree)
    bs, n = tree.tokens.shape
    for b in range(bs):
        nn_ = int(tree.num_nodes[b])
        assert index[b].tolist() == [b * n + i for i in range(n)]
        seen_parent = {0: -1}
        stack = [0]
        while stack:  # depth-first walk over first-child / next-sibling links
            node = stack.pop()
            child = int(next_token[b, node])
            prev = None
            while child != -1:
                seen_parent[child] = node
                if prev is not None:
                    assert child > prev, "siblings chained in node order"
                prev = child
                stack.append(child)
                child = int(next_sibling[b, child])
        assert seen_parent == {i: int(tree.parents[b, i]) for i in range(nn_)}
        for i in range(nn_, n):
            assert int(next_token[b, i]) == -1 and int(next_sibling[b, i]) == -1


def test_batch_rows_are_independent():
    logits, roots, tree = random_tree(bs=5, seed=11)
    for b in range(5):
        one = build_tree(logits[b:b + 1], roots[b:b + 1], budget=24, topk_cap=4)
        for field in ("tokens", "parents", "depths", "scores", "num_nodes", "ancestor_mask"):
            assert torch.equal(getattr(one, field)[0], getattr(tree, field)[b]), field


def test_chain_when_budget_equals_depth_and_cap_one():
    logits = torch.randn(3, 6, 50)
    tree = build_tree(logits, torch.tensor([1, 2, 3]), budget=6, topk_cap=1)
    assert torch.equal(tree.tokens[:, 1:], logits.argmax(-1))
    assert tree.parents[:, 1:].tolist() == [[0, 1, 2, 3, 4, 5]] * 3
    assert tree.depths[:, 1:].tolist() == [[1, 2, 3, 4, 5, 6]] * 3


def test_ties_break_to_smaller_token_ids_deterministically():
    logits = torch.zeros(2, 3, 10)  # every token ties
    first = build_tree(logits, torch.tensor([0, 0]), budget=12, topk_cap=3)
    again = build_tree(logits, torch.tensor([0, 0]), budget=12, topk_cap=3)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.parents, again.parents)
    assert first.tokens[0, 1:4].tolist() == [0, 1, 2]  # depth 1 first (ties prefer shallower)
    cand = draft_candidates_torch(logits, 3)
    assert cand.tokens[0, 0].tolist() == [0, 1, 2]


def test_one_hot_draft_keeps_ancestor_closure_under_equal_scores():
    logits = torch.full((1, 4, 6), -1e4)
    logits[0, :, 2] = 0.0  # probability ~1 for token 2 at every depth: paths tie at score ~0
    tree = build_tree(logits, torch.tensor([5]), budget=8, topk_cap=3)
    for i in range(1, int(tree.num_nodes[0])):
        assert int(tree.parents[0, i]) < i


def test_masked_tokens_never_become_candidates():
    logits = torch.randn(2, 3, 8)
    logits[..., 3:] = float("-inf")  # only tokens 0..2 possible
    tree = build_tree(logits, torch.tensor([7, 7]), budget=60, topk_cap=8)
    valid = tree.depths > 0
    assert (tree.tokens[valid] < 3).all()
    assert tree.num_nodes.tolist() == [1 + 3 + 9 + 27] * 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_low_and_high_precision_logits(dtype):
    logits = torch.randn(2, 4, 30)
    tree = build_tree(logits.to(dtype), torch.tensor([1, 2]), budget=16, topk_cap=4)
    ref = build_tree(logits.to(dtype).float(), torch.tensor([1, 2]), budget=16, topk_cap=4)
    assert torch.equal(tree.tokens, ref.tokens)
    assert tree.scores.dtype == torch.float32
