"""build_tree / verify_tree on a real GPU: Triton == torch at Kimi's vocabulary, graph replay exact."""

from __future__ import annotations

import pytest
import torch

from ddtree import build_tree, verify_tree

from ..helpers import assert_same_tree, assert_same_verdict

pytestmark = pytest.mark.gpu
VOCAB = 163_840


@pytest.mark.parametrize("bs,depth,budget,cap", [(4, 7, 32, 8), (2, 15, 128, 128), (3, 7, 512, 8), (1, 3, 1, 1)])
def test_triton_equals_torch_at_full_vocabulary(bs, depth, budget, cap):
    g = torch.Generator(device="cuda").manual_seed(budget)
    draft = (torch.randn(bs, depth, VOCAB, device="cuda", generator=g) * 3).to(torch.bfloat16)
    roots = torch.randint(0, VOCAB, (bs,), device="cuda", generator=g)
    a = build_tree(draft, roots, budget=budget, topk_cap=cap, backend="triton")
    b = build_tree(draft, roots, budget=budget, topk_cap=cap, backend="torch")
    assert_same_tree(a, b, atol=1e-4)


def test_build_and_verify_replay_exactly_in_a_cuda_graph():
    bs, depth, budget, cap = 8, 7, 32, 8
    draft = torch.empty(bs, depth, VOCAB, device="cuda", dtype=torch.bfloat16)
    target = torch.empty(bs, budget + 1, VOCAB, device="cuda", dtype=torch.bfloat16)
    roots = torch.zeros(bs, dtype=torch.int64, device="cuda")

    def fill(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        draft.copy_(torch.randn(draft.shape, device="cuda", generator=g) * 3)
        # make the target agree with the draft's best paths often, so paths get accepted
        target.copy_(torch.randn(target.shape, device="cuda", generator=g))
        roots.copy_(torch.randint(0, VOCAB, (bs,), device="cuda", generator=g))

    def step():
        tree = build_tree(draft, roots, budget=budget, topk_cap=cap)
        return tree, verify_tree(tree, target, 0.0)

    fill(0)
    from bench import tree_build
    graph, (tree_g, verdict_g) = tree_build.graph_of(step)
    for seed in (1, 2, 3):
        fill(seed)
        tree_e, verdict_e = step()
        # plant the draft's best child as the target's argmax at the root: accept_len >= 1
        target[:, 0].fill_(-30.0)
        target[torch.arange(bs), 0, tree_e.tokens[:, 1]] = 30.0
        tree_e, verdict_e = step()
        graph.replay()
        assert_same_tree(tree_g, tree_e, atol=0.0)
        assert_same_verdict(verdict_g, verdict_e)
        assert (verdict_e.accept_len >= 1).all()
