"""The plugin's glue against SGLang 0.5.23's own JIT tree kernels, on the GPU.

Needs CUDA and the wheels of tools/fetch_sglang_kernel_wheels.sh (installed with --target and put
on PYTHONPATH together with .whl/flashinfer-headers). A disagreement here is a silent
wrong-token bug on the production host.
"""

from __future__ import annotations

import itertools
import pytest
import torch

from ddtree import build_tree, verify_tree
from ddtree.sglang.step.glue import full_mask
from tests.eagle_format import accept_from_verdict, eagle_layout

from ..helpers import chi_square_pvalue as chi_square_p

pytestmark = [pytest.mark.gpu, pytest.mark.sglang_kernels]
tree_ops = pytest.importorskip("sglang.kernels.ops.speculative.tree",
                               reason="SGLang's tree kernels are not importable (tools/fetch_sglang_kernel_wheels.sh)")


def planted_target(tree, vocab: int, follow: float, g: torch.Generator) -> torch.Tensor:
    """Random target logits [bs, N, V] whose argmax at a node is one of its children with prob `follow`."""
    bs, n = tree.tokens.shape
    logits = torch.randn(bs, n, vocab, device="cuda", generator=g)
    children = tree.parents[:, None, :] == torch.arange(n, device="cuda")[None, :, None]   # [bs, node, child]
    pick = torch.rand(bs, n, n, device="cuda", generator=g) * children                    # random child
    best_child = pick.argmax(-1)                                                            # [bs, N]
    has_child = children.any(-1) & (torch.rand(bs, n, device="cuda", generator=g) < follow)
    token = tree.tokens.gather(1, best_child)
    boost = torch.zeros_like(logits).scatter_(-1, token[..., None], 50.0)
    return torch.where(has_child[..., None], logits + boost, logits)


def random_cases(count: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    vocabs = [8, 100, 5000, 163_840]
    for i in range(count):
        r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
        bs, depth = r(1, 16), r(3, 15)
        budget = [1, 2, 7, 32, 100, 256][i % 6]
        cap = r(1, budget)
        vocab = vocabs[i % len(vocabs)] if budget <= 100 or i % len(vocabs) != 3 else 5000
        yield bs, depth, budget, min(cap, vocab), vocab, i


@pytest.mark.parametrize("bs,depth,budget,cap,vocab,seed", list(random_cases(36)))
def test_verify_tree_greedy_agrees_with_verify_tree(bs, depth, budget, cap, vocab, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    draft = torch.randn(bs, depth, vocab, device="cuda", generator=g) * 3
    roots = torch.randint(0, vocab, (bs,), device="cuda", generator=g)
    tree = build_tree(draft, roots, budget=budget, topk_cap=cap)
    target = planted_target(tree, vocab, follow=0.8, g=g)
    n = tree.width
    index, next_token, next_sibling = eagle_layout(tree)
    predicts = torch.zeros(bs * n, dtype=torch.int32, device="cuda")
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int32, device="cuda")
    accept_num = torch.zeros(bs, dtype=torch.int32, device="cuda")
    tree_ops.verify_tree_greedy(predicts, accept_index, accept_num, tree.tokens.contiguous(), index.contiguous(),
                                next_token.contiguous(), next_sibling.contiguous(), target.argmax(-1).contiguous())
    ours = accept_from_verdict(verify_tree(tree, target, 0.0), n)
    assert torch.equal(accept_num.long(), ours.accept_length)
    assert torch.equal(accept_index.long(), ours.accept_index)
    assert torch.equal(predicts.long(), ours.predict)
    if budget >= 7:
        assert int(ours.accept_length.max()) >= 1  # the planted target makes walks go somewhere


@pytest.mark.parametrize("bs,depth,budget,cap,vocab,seed", list(random_cases(12, seed=1)))
def test_reconstruct_from_the_plugins_mask_gives_the_plugins_layout(bs, depth, budget, cap, vocab, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tree = build_tree(torch.randn(bs, depth, vocab, device="cuda", generator=g), torch.zeros(bs, dtype=torch.int64,
                      device="cuda"), budget=budget, topk_cap=cap)
    n = tree.width
    prefix = torch.randint(0, 300, (bs,), device="cuda", generator=g)
    lens = prefix.tolist()
    mask = full_mask(tree, prefix, sum((p + n) * n for p in lens))
    # SGLang's reconstruct kernel reads the tree columns only (an N x N block per request):
    # take them out of the plugin's FULL_MASK rows, dropping each request's prefix columns
    blocks, off = [], 0
    for p in lens:
        rows = mask[off: off + (p + n) * n].view(n, p + n)
        blocks.append(rows[:, p:])
        off += (p + n) * n
    tree_mask = torch.stack(blocks).contiguous()                                   # [bs, N, N]
    positions = torch.empty(bs * n, dtype=torch.int64, device="cuda")
    r_index, r_next, r_sib = (torch.empty(bs, n, dtype=torch.int64, device="cuda") for _ in range(3))
    tree_ops.reconstruct_indices_from_tree_mask(tree_mask.view(-1), prefix.contiguous(), positions, r_index, r_next,
                                                r_sib, bs, n)
    index, next_token, next_sibling = eagle_layout(tree)
    assert torch.equal(positions, tree.positions(prefix).reshape(-1))
    assert torch.equal(r_index, index)
    assert torch.equal(r_next, next_token)
    assert torch.equal(r_sib, next_sibling)


def exact_emission(tree, probs: torch.Tensor) -> dict[tuple, float]:
    """P(emitted tokens) for one tree: probs [N, V] float64 per node (sample-and-match)."""
    out: dict[tuple, float] = {}
    n = int(tree.num_nodes[0])
    kids = {i: [j for j in range(n) if int(tree.parents[0, j]) == i] for i in range(n)}

    def walk(node: int, prefix: tuple, p: float) -> None:
        child_tok = {int(tree.tokens[0, c]): c for c in kids[node]}
        for tok, pt in enumerate(probs[node].tolist()):
            if pt == 0:
                continue
            if tok in child_tok:
                walk(child_tok[tok], prefix + (tok,), p * pt)
            else:
                out[prefix + (tok,)] = out.get(prefix + (tok,), 0.0) + p * pt

    walk(0, (), 1.0)
    return out


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_kernel_matches_verify_tree_in_distribution(temperature):
    sampling = pytest.importorskip("sglang.kernels.ops.speculative.sampling",
                                   reason="SGLang's sampling verifier needs FlashInfer's headers on PYTHONPATH")
    g = torch.Generator(device="cuda").manual_seed(3)
    vocab, rows = 6, 100_000
    draft = torch.randn(1, 3, vocab, device="cuda", generator=g)
    one = build_tree(draft, torch.tensor([0], device="cuda"), budget=5, topk_cap=3)
    n = one.width
    logits = torch.randn(1, n, vocab, device="cuda", generator=g) * 1.5
    probs = torch.softmax(logits.float() / temperature, dim=-1)                    # [1, N, V]
    exact = probs[0].double().cpu()
    want = exact_emission(one, exact / exact.sum(-1, keepdim=True))  # renormalised in float64

    rep = type(one)(**{f: (getattr(one, f).expand(rows, *getattr(one, f).shape[1:]).contiguous()
                           if f != "max_depth" else one.max_depth) for f in
                       ("tokens", "parents", "depths", "scores", "num_nodes", "ancestor_mask", "max_depth")})
    ours = verify_tree(rep, logits.expand(rows, -1, -1).contiguous(), temperature,
                       generator=torch.Generator(device="cuda").manual_seed(11))
    our_samples = [tuple(t[: k + 1]) for t, k in zip(ours.tokens.tolist(), ours.accept_len.tolist())]

    index, next_token, next_sibling = eagle_layout(rep)
    predicts = torch.zeros(rows * n, dtype=torch.int32, device="cuda")
    accept_index = torch.full((rows, one.max_depth + 1), -1, dtype=torch.int32, device="cuda")
    accept_num = torch.zeros(rows, dtype=torch.int32, device="cuda")
    sampling.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, rep.tokens, index, next_token, next_sibling,
        torch.rand(rows, n, device="cuda", generator=g), torch.rand(rows, device="cuda", generator=g),
        probs.expand(rows, -1, -1).contiguous(), torch.zeros(rows, n, vocab, device="cuda"),
        threshold_single=1.0, threshold_acc=1.0, deterministic=True)
    acc = accept_index.long().cpu()
    pred = predicts.long().cpu()
    toks = rep.tokens.cpu()
    sg_samples = []
    for b in range(rows):
        k = int(accept_num[b])
        path = acc[b, : k + 1]
        local = path - b * n
        sg_samples.append(tuple(toks[b, local[1:]].tolist()) + (int(pred[path[-1]]),))
    assert chi_square_p(our_samples, want) > 1e-3
    assert chi_square_p(sg_samples, want) > 1e-3
