"""verify_tree: greedy walk against a plain Python walk, sampling filters, argument errors."""

from __future__ import annotations

import pytest
import torch

from ddtree import DraftTree, build_tree, verify_tree
from ddtree.verify import target_probs


def python_walk(tree: DraftTree, targets: torch.Tensor, b: int) -> tuple[list[int], int]:
    """The textbook walk: from the root, move to the child whose token is the target's token."""
    node, path = 0, [0]
    while True:
        want = int(targets[b, node])
        nxt = [i for i in range(int(tree.num_nodes[b])) if int(tree.parents[b, i]) == node
               and int(tree.tokens[b, i]) == want]
        if not nxt:
            return path, want
        node = nxt[0]
        path.append(node)


def logits_with_argmax(argmax: torch.Tensor, vocab: int) -> torch.Tensor:
    """Random logits [bs, N, V] whose argmax at each node is the given token."""
    out = torch.randn(*argmax.shape, vocab)
    out.scatter_(-1, argmax[..., None], 10.0)
    return out


def chain_tree(tokens: list[int], vocab: int = 10) -> DraftTree:
    """A chain root -> tokens[0] -> tokens[1] ... built through build_tree (cap 1)."""
    logits = torch.full((1, len(tokens), vocab), -5.0)
    for d, t in enumerate(tokens):
        logits[0, d, t] = 5.0
    return build_tree(logits, torch.tensor([9]), budget=len(tokens), topk_cap=1)


def test_full_acceptance_of_a_chain():
    tree = chain_tree([3, 4, 5])
    targets = torch.tensor([[3, 4, 5, 7]])
    v = verify_tree(tree, logits_with_argmax(targets, 10), 0.0)
    assert v.accept_len.tolist() == [3] and v.accepted.tolist() == [[0, 1, 2, 3]]
    assert v.bonus.tolist() == [7] and v.tokens.tolist() == [[3, 4, 5, 7]]


def test_early_mismatch_stops_the_walk():
    tree = chain_tree([3, 4, 5])
    targets = torch.tensor([[3, 8, 5, 7]])  # node 1's target disagrees with node 2's token
    v = verify_tree(tree, logits_with_argmax(targets, 10), 0.0)
    assert v.accept_len.tolist() == [1] and v.accepted.tolist() == [[0, 1, -1, -1]]
    assert v.bonus.tolist() == [8] and v.tokens.tolist() == [[3, 8, -1, -1]]


def test_mismatch_at_the_root_emits_only_the_bonus():
    tree = chain_tree([3, 4, 5])
    targets = torch.tensor([[6, 4, 5, 7]])
    v = verify_tree(tree, logits_with_argmax(targets, 10), 0.0)
    assert v.accept_len.tolist() == [0] and v.accepted.tolist() == [[0, -1, -1, -1]]
    assert v.bonus.tolist() == [6] and v.tokens.tolist() == [[6, -1, -1, -1]]


def test_walk_takes_a_second_sibling():
    logits = torch.full((1, 2, 6), -9.0)
    logits[0, 0, 1], logits[0, 0, 2] = 2.0, 1.0  # depth 1: token 1 best, token 2 second
    logits[0, 1, 4] = 2.0
    tree = build_tree(logits, torch.tensor([0]), budget=4, topk_cap=2)
    targets = torch.zeros(1, 5, dtype=torch.int64)
    node_of_2 = int((tree.tokens[0] == 2).nonzero()[0, 0])
    targets[0, 0] = 2
    targets[0, node_of_2] = 4
    for i in range(5):  # children of the token-2 node with token 4 may exist; else bonus
        if i not in (0, node_of_2):
            targets[0, i] = 5
    v = verify_tree(tree, logits_with_argmax(targets, 6), 0.0)
    path, bonus = python_walk(tree, targets, 0)
    assert v.accepted[0, : len(path)].tolist() == path and v.bonus.tolist() == [bonus]
    assert path[1] == node_of_2


@pytest.mark.parametrize("seed", range(20))
def test_greedy_matches_python_walk_on_random_trees(seed):
    g = torch.Generator().manual_seed(seed)
    vocab, bs, max_depth = 4, 6, 4  # small vocabulary: long acceptances happen
    draft = torch.randn(bs, max_depth, vocab, generator=g)
    tree = build_tree(draft, torch.zeros(bs, dtype=torch.int64), budget=12, topk_cap=3)
    targets = torch.randint(0, vocab, (bs, 13), generator=g)
    v = verify_tree(tree, logits_with_argmax(targets, vocab), torch.zeros(bs))
    for b in range(bs):
        path, bonus = python_walk(tree, targets, b)
        assert v.accept_len[b].item() == len(path) - 1
        assert v.accepted[b, : len(path)].tolist() == path
        assert (v.accepted[b, len(path):] == -1).all()
        assert v.bonus[b].item() == bonus
        want = [int(tree.tokens[b, i]) for i in path[1:]] + [bonus]
        assert v.tokens[b, : len(want)].tolist() == want and (v.tokens[b, len(want):] == -1).all()


def test_mixed_greedy_and_sampled_requests():
    tree = chain_tree([3, 4, 5])
    tree2 = build_tree(torch.cat([torch.full((1, 3, 10), -5.0)] * 2).index_put_(
        (torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([3, 4, 5, 3, 4, 5])),
        torch.tensor(5.0)), torch.tensor([9, 9]), budget=3, topk_cap=1)
    assert torch.equal(tree2.tokens[0], tree.tokens[0])
    targets = torch.tensor([[3, 4, 5, 7], [3, 4, 5, 7]])
    logits = logits_with_argmax(targets, 10)
    logits[1] = 0.0  # request 1 samples uniformly; request 0 is greedy
    g = torch.Generator().manual_seed(0)
    v = verify_tree(tree2, logits, torch.tensor([0.0, 1.0]), generator=g)
    assert v.tokens[0].tolist() == [3, 4, 5, 7]
    assert 0 <= int(v.accept_len[1]) <= 3


def test_target_probs_filters_in_sglang_order():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    one = torch.ones(4)
    p = target_probs(logits, one, None, torch.tensor([0.8, 0.81, 1.0, 0.5]), None)
    assert p[0].tolist() == pytest.approx([0.625, 0.375, 0, 0])  # mass 0.8 reached after two
    assert p[1].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert p[2].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert p[3].tolist() == pytest.approx([1, 0, 0, 0])
    # top-k renormalises before top-p: [.526, .316, .158] reaches 0.9 only with all three
    p = target_probs(logits[:1], one[:1], torch.tensor([3]), torch.tensor([0.9]), None)
    assert p[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    p = target_probs(logits[:1], one[:1], torch.tensor([0]), None, torch.tensor([0.4]))
    assert p[0].tolist() == pytest.approx([0.625, 0.375, 0, 0])  # below 0.4 * 0.5 dropped
    p = target_probs(logits[:1], torch.tensor([0.5]), None, None, None)
    want = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 2
    assert p[0].tolist() == pytest.approx((want / want.sum()).tolist())


@pytest.fixture
def small_tree():
    return build_tree(torch.randn(2, 3, 8), torch.tensor([1, 2]), budget=5, topk_cap=2)


BAD_BUILD = [
    (dict(budget=0), "budget=0"),
    (dict(budget=-3), "budget=-3"),
    (dict(budget=2.5), "budget=2.5"),
    (dict(topk_cap=0), "topk_cap=0"),
    (dict(logits=torch.randn(2, 0, 8)), r"draft_logits.shape=\(2, 0, 8\)"),
    (dict(logits=torch.randint(0, 5, (2, 3, 8))), "draft_logits.dtype=torch.int64"),
    (dict(logits=torch.randn(2, 8)), r"draft_logits.shape=\(2, 8\)"),
    (dict(roots=torch.tensor([1, 2, 3])), r"root_tokens.shape=\(3,\)"),
    (dict(roots=torch.tensor([1.0, 2.0])), "root_tokens.dtype=torch.float32"),
    (dict(roots=[1, 2]), "root_tokens='list'"),
]


@pytest.mark.parametrize("override,message", BAD_BUILD)
def test_build_tree_rejects_bad_arguments(override, message):
    args = dict(logits=torch.randn(2, 3, 8), roots=torch.tensor([1, 2]), budget=4, topk_cap=2)
    args.update(override)
    with pytest.raises(ValueError, match=message) as err:
        build_tree(args["logits"], args["roots"], budget=args["budget"], topk_cap=args["topk_cap"])
    assert "expected" in str(err.value) or "must" in str(err.value)


BAD_VERIFY = [
    (dict(logits=torch.randn(2, 5, 8)), r"target_logits.shape=\(2, 5, 8\)"),
    (dict(logits=torch.zeros(2, 6, 8, dtype=torch.int64)), "target_logits.dtype"),
    (dict(temperature=-0.5), "temperature=-0.5"),
    (dict(temperature=torch.tensor([0.5, -1.0])), r"temperature\[1\]=-1.0"),
    (dict(temperature=torch.tensor([0.5])), r"temperature.shape=\(1,\)"),
    (dict(temperature=float("nan")), "temperature=nan"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(top_p=torch.tensor([1.0, 0.0])), r"top_p\[1\]=0.0"),
    (dict(min_p=1.0), "min_p=1.0"),
    (dict(min_p=-0.1), "min_p=-0.1"),
    (dict(top_k=torch.tensor([1.0, 2.0])), "top_k.dtype"),
    (dict(top_k=2.5), "top_k=2.5"),
    (dict(temperature="hot"), "temperature='hot'"),
]


@pytest.mark.parametrize("override,message", BAD_VERIFY)
def test_verify_tree_rejects_bad_arguments(small_tree, override, message):
    args = dict(logits=torch.randn(2, 6, 8), temperature=1.0, top_p=None, top_k=None, min_p=None)
    args.update(override)
    with pytest.raises(ValueError, match=message):
        verify_tree(small_tree, args["logits"], args["temperature"], top_p=args["top_p"],
                    top_k=args["top_k"], min_p=args["min_p"])


def test_verify_rejects_something_that_is_not_a_tree():
    with pytest.raises(ValueError, match="tree='dict'"):
        verify_tree({}, torch.randn(2, 6, 8), 0.0)


def test_nan_logits_are_reported_only_in_debug_mode(monkeypatch):
    logits = torch.randn(1, 2, 5)
    logits[0, 1, 3] = float("nan")
    build_tree(logits, torch.tensor([0]), budget=3, topk_cap=2)  # no scan by default
    monkeypatch.setenv("DDTREE_DEBUG", "1")
    with pytest.raises(ValueError, match="draft_logits='contains NaN'"):
        build_tree(logits, torch.tensor([0]), budget=3, topk_cap=2)
