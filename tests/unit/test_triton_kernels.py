"""The Triton build path gives exactly the torch path's tree.

On a CUDA machine the kernels run compiled; elsewhere in Triton's interpreter (small shapes).
"""

from __future__ import annotations

import pytest
import torch

from ddtree import build_tree, verify_tree
from ddtree.tree import draft_candidates_torch

from ..helpers import assert_same_tree, assert_same_verdict

triton_mod = pytest.importorskip("ddtree._triton")
pytestmark = pytest.mark.skipif(not triton_mod.available(), reason="triton not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SHAPES = [  # (bs, L, V, budget, cap)
    (2, 3, 50, 6, 3), (3, 4, 300, 20, 4), (1, 2, 9, 50, 8), (2, 3, 40, 8, 1), (1, 5, 6, 40, 6),
    (2, 2, 4100, 10, 8), (2, 3, 20, 1, 1),  # two vocabulary chunks; budget 1
]


@pytest.mark.parametrize("bs,max_depth,vocab,budget,cap", SHAPES)
def test_triton_tree_equals_torch_tree(bs, max_depth, vocab, budget, cap):
    g = torch.Generator().manual_seed(bs * 1000 + vocab)
    logits = (torch.randn(bs, max_depth, vocab, generator=g) * 2).to(DEVICE)
    logits[..., 1] = logits[..., 4]  # exact ties must break the same way
    roots = torch.randint(0, vocab, (bs,), generator=g).to(DEVICE)
    a = build_tree(logits, roots, budget=budget, topk_cap=cap, backend="triton")
    b = build_tree(logits, roots, budget=budget, topk_cap=cap, backend="torch")
    assert_same_tree(a, b)


def test_triton_candidates_equal_torch_candidates_with_masked_tokens():
    logits = torch.randn(2, 3, 70)
    logits[0, :, 5:] = float("-inf")  # fewer finite tokens than K
    logits = logits.to(DEVICE)
    a = triton_mod.draft_candidates(logits, 8)
    b = draft_candidates_torch(logits, 8)
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(torch.isinf(a.logp), torch.isinf(b.logp))
    finite = torch.isfinite(b.logp)
    assert torch.allclose(a.logp[finite], b.logp[finite], atol=1e-5)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend='cuda'"):
        build_tree(torch.randn(1, 2, 5), torch.tensor([0]), budget=3, topk_cap=2, backend="cuda")


@pytest.mark.parametrize("seed", range(4))
def test_triton_verify_equals_torch_verify(seed):
    g = torch.Generator().manual_seed(seed)
    vocab, bs, depth, budget = 5, 6, 4, 14  # small vocabulary: long acceptances happen
    draft = torch.randn(bs, depth, vocab, generator=g).to(DEVICE)
    tree = build_tree(draft, torch.zeros(bs, dtype=torch.int64, device=DEVICE), budget=budget, topk_cap=3)
    target = torch.randn(bs, budget + 1, vocab, generator=g).to(DEVICE)
    target[..., 2] = target[..., 3]  # ties: smallest index wins in both
    a = verify_tree(tree, target, 0.0, backend="triton")
    b = verify_tree(tree, target, 0.0, backend="torch")
    assert_same_verdict(a, b)
    assert int(b.accept_len.max()) >= 1  # the walk went somewhere


def test_triton_argmax_matches_torch_over_chunks():
    x = torch.randn(3, 4, 9000).to(DEVICE)
    x[0, 0, 8999] = x[0, 0, 10] = 50.0  # tie across chunks: the smaller index
    assert torch.equal(triton_mod.argmax_rows(x), x.argmax(dim=-1))


@pytest.mark.parametrize("vocab,world,k", [(60, 2, 8), (12, 4, 8), (8200, 2, 4), (300, 3, 1)])
def test_triton_shard_candidates_equal_torch_shard_candidates(vocab, world, k):
    """A TP rank's shard: same global ids, raw logits and log-normaliser as the torch path.

    Shards of 3 columns are narrower than k (padded with -inf / PAD_ID); 4100-column shards span
    two chunks; a tie across a shard boundary and a masked-out row are included.
    """
    from ddtree.tp import shard_candidates, shard_candidates_torch
    from ddtree.types import PAD_ID

    g = torch.Generator().manual_seed(vocab + world)
    x = (torch.randn(2, 3, vocab, generator=g) * 3).to(torch.bfloat16)
    x[..., vocab // world - 1] = x[..., vocab // world]  # tie across the first boundary
    x[1, 0, :] = float("-inf")                          # a row with no finite token
    x = x.to(DEVICE)
    bounds = [vocab * r // world for r in range(world + 1)]
    for lo, hi in zip(bounds, bounds[1:]):
        a = shard_candidates(x[..., lo:hi], k, lo, backend="triton")
        b = shard_candidates_torch(x[..., lo:hi], k, lo)
        assert torch.equal(a.ids, b.ids), (lo, hi)
        assert torch.equal(a.logits, b.logits), (lo, hi)
        assert torch.equal(torch.isinf(a.log_z), torch.isinf(b.log_z))
        finite = torch.isfinite(b.log_z)
        assert torch.allclose(a.log_z[finite], b.log_z[finite], atol=1e-5)
        assert bool(((a.ids >= lo) & (a.ids < hi) | (a.ids == PAD_ID)).all())


# --- the SGLang glue kernels: verify mask + positions, and the commit, against their torch paths ---

GLUE_SHAPES = [  # (bs, L, V, budget, cap, prefix lengths); the last: a window (N = 4) narrower than the path (L + 1 = 8)
    (1, 3, 30, 6, 3, [5]), (3, 4, 40, 12, 4, [0, 9, 1]), (2, 7, 20, 31, 8, [1500, 3]), (2, 2, 9, 2, 1, [2, 2]),
    (2, 7, 20, 3, 2, [4, 11]),
]


def _tree_and_verdict(bs, max_depth, vocab, budget, cap, seed):
    from ddtree.verify import walk_tree

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, max_depth, vocab, generator=g) * 3
    roots = torch.randint(0, vocab, (bs,), generator=g)
    tree = build_tree(logits, roots, budget=budget, topk_cap=cap, backend="torch")
    # targets that follow a random valid path now and then: each node's target is the token of
    # one of its children when it has any (so paths are accepted to various depths)
    targets = torch.randint(0, vocab, tree.tokens.shape, generator=g)
    for b in range(bs):
        for i in range(1, tree.tokens.shape[1]):
            p = int(tree.parents[b, i])
            if p >= 0 and torch.rand((), generator=g) < 0.6:
                targets[b, p] = tree.tokens[b, i]
    return tree, walk_tree(tree, targets)


@pytest.mark.parametrize("bs,max_depth,vocab,budget,cap,prefix", GLUE_SHAPES)
def test_triton_verify_mask_equals_torch(bs, max_depth, vocab, budget, cap, prefix):
    from ddtree.sglang.step.glue import verify_mask

    tree, _ = _tree_and_verdict(bs, max_depth, vocab, budget, cap, seed=bs + budget)
    n = budget + 1
    prefix_lens = torch.tensor(prefix, dtype=torch.int64)
    total = sum((p + n) * n for p in prefix)
    a = verify_mask(_to(tree), prefix_lens.to(DEVICE), total, max(prefix), backend="triton")
    b = verify_mask(tree, prefix_lens, total, max(prefix), backend="torch")
    assert a.custom_mask.shape == (total,) and a.custom_mask.dtype == torch.bool
    assert torch.equal(a.custom_mask.cpu(), b.custom_mask)
    assert torch.equal(a.positions.cpu(), b.positions)


@pytest.mark.parametrize("bs,max_depth,vocab,budget,cap,prefix", GLUE_SHAPES)
def test_triton_commit_equals_torch(bs, max_depth, vocab, budget, cap, prefix):
    from ddtree.sglang.step.glue import commit_step

    tree, verdict = _tree_and_verdict(bs, max_depth, vocab, budget, cap, seed=7 * bs + budget)
    assert int(verdict.accept_len.max()) > 0          # some request accepted a draft token
    n = budget + 1
    prefix_lens = torch.tensor(prefix, dtype=torch.int64)
    pool = torch.tensor([5, 2, 7][:bs])
    window = torch.randperm(10_000)[: bs * n].view(bs, n)
    draft_ids = window + 50_000
    tables = [torch.full((8, max(prefix) + n + 4), -7, dtype=torch.int32) for _ in range(2)]
    for t in tables:
        for b in range(bs):
            t[pool[b], prefix[b]: prefix[b] + n] = window[b].to(torch.int32)
    if bs == 3:
        draft_ids = draft_ids.to(torch.int32)          # SGLang's write ids may be either width
    on_device = tables[0].to(DEVICE)
    a = commit_step(_to(verdict), window.to(DEVICE), draft_ids.to(DEVICE), prefix_lens.to(DEVICE), on_device,
                    pool.to(DEVICE), backend="triton")
    b = commit_step(verdict, window, draft_ids, prefix_lens, tables[1], pool, backend="torch")
    assert torch.equal(on_device.cpu(), tables[1])
    for name in ("out_tokens", "commit_lens", "new_seq_lens", "draft_slots", "hidden_rows", "positions"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert torch.equal(x.cpu(), y), name


@pytest.mark.parametrize("prefix", [[5], [0, 9, 1], [1500, 3]])
def test_a_root_only_tree_goes_through_the_glue_kernels_as_through_torch(prefix):
    """The width policy's step without speculation (issue 70): the tree is the root alone (N = 1); the mask, the
    positions and the commit of both paths agree, and the commit keeps one token per request."""
    from ddtree.sglang.step.glue import commit_step, verify_mask
    from ddtree.tree import root_only_tree
    from ddtree.verify import walk_tree

    bs = len(prefix)
    g = torch.Generator().manual_seed(bs)
    tree = root_only_tree(torch.randint(0, 50, (bs,), generator=g), max_depth=7)
    verdict = walk_tree(tree, torch.randint(0, 50, (bs, 1), generator=g))
    prefix_lens = torch.tensor(prefix, dtype=torch.int64)
    total = sum(p + 1 for p in prefix)
    a = verify_mask(_to(tree), prefix_lens.to(DEVICE), total, max(prefix), backend="triton")
    b = verify_mask(tree, prefix_lens, total, max(prefix), backend="torch")
    assert torch.equal(a.custom_mask.cpu(), b.custom_mask) and bool(b.custom_mask.all())
    assert torch.equal(a.positions.cpu(), b.positions) and torch.equal(b.positions[:, 0], prefix_lens)
    pool = torch.tensor([5, 2, 7][:bs])
    window = torch.randperm(1000, generator=g)[:bs].view(bs, 1)
    tables = [torch.full((8, max(prefix) + 5), -7, dtype=torch.int32) for _ in range(2)]
    for t in tables:
        for r in range(bs):
            t[pool[r], prefix[r]] = int(window[r, 0])
    on_device = tables[0].to(DEVICE)
    x = commit_step(_to(verdict), window.to(DEVICE), (window + 5000).to(DEVICE), prefix_lens.to(DEVICE), on_device,
                    pool.to(DEVICE), backend="triton")
    y = commit_step(verdict, window, window + 5000, prefix_lens, tables[1], pool, backend="torch")
    assert torch.equal(on_device.cpu(), tables[1])
    for name in ("out_tokens", "commit_lens", "new_seq_lens", "draft_slots", "hidden_rows", "positions"):
        assert torch.equal(getattr(x, name).cpu(), getattr(y, name)), name
    assert y.commit_lens.tolist() == [1] * bs and torch.equal(y.new_seq_lens, prefix_lens + 1)
    assert y.draft_slots.shape == (bs, 8) and bool((y.draft_slots == window + 5000).all())   # padded with the root's
    assert torch.equal(y.hidden_rows, torch.arange(bs)[:, None].expand(bs, 8))               # the root's row


def _to(obj):
    """A DraftTree or Verdict with its tensors on DEVICE."""
    import dataclasses

    return dataclasses.replace(obj, **{f.name: getattr(obj, f.name).to(DEVICE) for f in dataclasses.fields(obj)
                                       if isinstance(getattr(obj, f.name), torch.Tensor)})
