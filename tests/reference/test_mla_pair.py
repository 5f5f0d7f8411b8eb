"""The reference engine on a Kimi-shaped pair (MLA + MoE + YaRN target, ddtree.reference.mla): DDTREE's
tree passes (ancestor mask, depth positions, accepted nodes' K/V moved) give plain decoding's tokens
in float64, at several budgets and caps, one request and several of different lengths at once."""

from __future__ import annotations

import pytest
import torch

from ddtree.reference import generate


@pytest.mark.parametrize("budget,cap", [(3, 1), (8, 4), (16, 8)])
def test_ddtree_gives_plain_decodings_tokens_on_the_kimi_shaped_pair(kimi_pair, budget, cap):
    prompts = [[256, 10, 20, 30, 40], [256, 7], [256, 99, 98, 97, 96, 95, 94, 93, 92]]
    ar = generate(kimi_pair, prompts, max_new_tokens=24, method="ar")
    tree = generate(kimi_pair, prompts, max_new_tokens=24, method="ddtree", budget=budget, topk_cap=cap)
    assert [g.tokens for g in tree] == [g.tokens for g in ar]
    assert all(g.num_verify_steps <= a.num_verify_steps for g, a in zip(tree, ar))


def test_one_tree_pass_gives_each_nodes_path_logits(kimi_pair):
    """The verify pass DDTREE makes, on MLA: nodes at depth positions that see the prefix, their
    ancestors and themselves give, at every node, the logits of a causal pass over prefix + the node's
    path (siblings share positions and must not see each other)."""
    target = kimi_pair.target
    prefix = [256, 5, 9, 14, 3, 77, 41]
    tree = [(12, -1), (30, 0), (31, 0), (40, 1), (41, 1), (50, 3)]       # (token, parent index); node 0 the root
    depth = []
    for _, parent in tree:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    p, n = len(prefix), len(tree)
    with torch.no_grad():
        cache = target.new_cache(1, p + n)
        pos = torch.arange(p)[None]
        target(torch.tensor([prefix]), pos, cache, pos, pos[:, :, None] >= torch.arange(p + n)[None, None, :])
        visible = torch.zeros(1, n, p + n, dtype=torch.bool)
        visible[:, :, :p] = True
        for i in range(n):
            j = i
            while j >= 0:
                visible[0, i, p + j] = True
                j = tree[j][1]
        out = target(torch.tensor([[tok for tok, _ in tree]]), torch.tensor([[p + d for d in depth]]), cache,
                     torch.arange(p, p + n)[None], visible).logits[0]
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.insert(0, tree[j][0])
                j = tree[j][1]
            alone = target.forward_sequence(torch.tensor([prefix + path])).logits[0, -1]
            # the router scores in float32 (as SGLang and Hugging Face do): ~1e-7 between batch shapes;
            # a node that saw a sibling, or sat at a wrong position, is off by whole units
            assert (out[i] - alone).abs().max().item() < 1e-5, f"node {i}"
