"""Graph-buffer checks name the field; SGLang glue against hand-computed examples."""

from __future__ import annotations

import pytest
import torch

from ddtree import build_tree, verify_tree
from ddtree.graphs import FirstUseChecker, GraphBufferError, check_copy_sources
from tests.eagle_format import accept_from_verdict, verify_inputs


def test_none_source_is_named():
    dst = torch.zeros(8, dtype=torch.int64)
    with pytest.raises(GraphBufferError, match="'num_token_non_padded' is None"):
        check_copy_sources([("positions", torch.zeros(4, dtype=torch.int64), dst),
                            ("num_token_non_padded", None, torch.zeros(1, dtype=torch.int32))], "replay bs=4")


def test_misshaped_and_mistyped_sources_are_named():
    dst = torch.zeros(8, 3)
    with pytest.raises(GraphBufferError, match=r"'input_embeds' has shape \(9, 3\)"):
        check_copy_sources([("input_embeds", torch.zeros(9, 3), dst)], "capture")
    with pytest.raises(GraphBufferError, match=r"'input_embeds' has shape \(4, 2\)"):
        check_copy_sources([("input_embeds", torch.zeros(4, 2), dst)], "capture")
    with pytest.raises(GraphBufferError, match="'out_cache_loc' has dtype torch.int32"):
        check_copy_sources([("out_cache_loc", torch.zeros(4, dtype=torch.int32), torch.zeros(8, dtype=torch.int64))],
                           "capture")
    check_copy_sources([("ok", torch.zeros(4, 3), dst)], "capture")  # fits: no error


def test_first_use_checker_checks_each_shape_once():
    chk = FirstUseChecker()
    dst = torch.zeros(8)
    chk([("x", torch.zeros(4), dst)], "replay")
    chk([("x", torch.zeros(4), dst)], "replay")
    with pytest.raises(GraphBufferError):
        chk([("x", None, dst)], "replay")


def two_request_tree():
    """Request 0: root -> 5 -> 7, root -> 0; request 1: root -> 6 -> 3, root -> 2. N = 4 (budget 3)."""
    logits = torch.full((2, 2, 10), -20.0)
    logits[0, 0, 5], logits[0, 1, 7] = 5.0, 5.0                       # a sure chain for request 0
    logits[1, 0, 6], logits[1, 0, 2] = 5.0, 4.0                       # two first tokens for request 1
    logits[1, 1, 3] = 5.0
    return build_tree(logits, torch.tensor([9, 8]), budget=3, topk_cap=2)


def test_verify_inputs_by_hand():
    tree = two_request_tree()
    assert tree.tokens.tolist() == [[9, 5, 7, 0], [8, 6, 3, 2]]
    assert tree.parents.tolist() == [[-1, 0, 1, 0], [-1, 0, 1, 0]]
    prefix = torch.tensor([3, 1])
    vi = verify_inputs(tree, prefix, [3, 1])
    assert vi.draft_token_num == 4 and vi.draft_tokens.tolist() == [9, 5, 7, 0, 8, 6, 3, 2]
    assert vi.positions.tolist() == [3, 4, 5, 4, 1, 2, 3, 2]
    assert vi.custom_mask.numel() == (3 + 4) * 4 + (1 + 4) * 4
    m0 = vi.custom_mask[: 7 * 4].view(4, 7)
    assert m0[:, :3].all()                                          # the prefix is visible to every node
    assert m0[:, 3:].tolist() == tree.ancestor_mask[0].tolist()
    assert m0[2, 3:].tolist() == [True, True, True, False]          # node 2 (7) sees root, 5 and itself
    m1 = vi.custom_mask[7 * 4:].view(4, 5)
    assert m1[:, :1].all() and m1[:, 1:].tolist() == tree.ancestor_mask[1].tolist()
    assert m1[2, 1:].tolist() == [True, True, True, False]           # node 2 (3) under node 1 (6)
    assert m1[3, 1:].tolist() == [True, False, False, True]          # node 3 (2) under the root


def test_accept_mapping_by_hand():
    tree = two_request_tree()
    target = torch.full((2, 4, 10), -9.0)
    # request 0 accepts 5 then 7, bonus 1; request 1 accepts 2 (node 3, second child of the root), bonus 4
    target[0, 0, 5], target[0, 1, 7], target[0, 2, 1] = 9.0, 9.0, 9.0
    target[1, 0, 2], target[1, 3, 4] = 9.0, 9.0
    verdict = verify_tree(tree, target, 0.0)
    acc = accept_from_verdict(verdict, 4)
    assert acc.accept_index.tolist() == [[0, 1, 2], [4, 7, -1]]
    assert acc.accept_length.tolist() == [2, 1]
    want = torch.zeros(8, dtype=torch.int64)
    want[0], want[1], want[2] = 5, 7, 1
    want[4], want[7] = 2, 4
    assert acc.predict.tolist() == want.tolist()


def test_buffer_registry_names_the_missing_or_misfit_source_and_copies_rows():
    from ddtree.graphs import BufferRegistry

    reg = BufferRegistry("decode graph (bucket 4)")
    roots = reg.register("roots", torch.zeros(4, dtype=torch.int64))
    lengths = reg.register("lengths", torch.zeros(4, dtype=torch.int64))
    with pytest.raises(GraphBufferError, match="'lengths' is None"):
        reg.copy_in({"roots": torch.ones(2, dtype=torch.int64)}, "capture")
    with pytest.raises(GraphBufferError, match="'roots' has dtype torch.int32"):
        reg.copy_in({"roots": torch.ones(2, dtype=torch.int32), "lengths": torch.ones(2, dtype=torch.int64)},
                    "replay")
    with pytest.raises(GraphBufferError, match=r"'lengths' has shape \(5,\)"):
        reg.copy_in({"roots": torch.ones(2, dtype=torch.int64), "lengths": torch.ones(5, dtype=torch.int64)},
                    "replay")
    reg.copy_in({"roots": torch.tensor([7, 8]), "lengths": torch.tensor([3, 4])}, "replay")
    assert roots.tolist() == [7, 8, 0, 0] and lengths.tolist() == [3, 4, 0, 0]
    with pytest.raises(GraphBufferError, match="'roots' registered twice"):
        reg.register("roots", torch.zeros(4, dtype=torch.int64))


def test_cuda_graphs_on_a_cpu_pair_is_refused_with_the_fix():
    from ddtree.reference.engine import Decoder

    from ..reference.conftest import small_vocab_pair

    with pytest.raises(ValueError, match="cuda_graphs=True needs the pair on a CUDA device"):
        Decoder(small_vocab_pair(), "ddtree", 4, 2, cuda_graphs=True)


def test_commit_plan_keeps_the_accepted_path_by_permuting_the_window():
    from ddtree.sglang.step.glue import commit_plan, rewrite_req_to_token
    from ddtree.types import DraftTree
    from ddtree.verify import walk_tree

    # request 0: root -> {5 (node 1), 6 (node 2)}, 5 -> 7 (node 3); request 1: a chain 4 -> 8 -> 9 (nodes 1..3)
    tokens = torch.tensor([[1, 5, 6, 7], [2, 4, 8, 9]])
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]])
    depths = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]])
    anc = torch.zeros(2, 4, 4, dtype=torch.bool)
    for b in range(2):
        for i in range(4):
            j = i
            while j >= 0:
                anc[b, i, j] = True
                j = int(parents[b, j])
    tree = DraftTree(tokens=tokens, parents=parents, depths=depths, ancestor_mask=anc,
                     scores=torch.zeros(2, 4), num_nodes=torch.tensor([4, 4]), max_depth=3)
    # target: request 0 accepts 5 then 7, bonus 3; request 1 accepts 4 only, bonus 0
    targets = torch.tensor([[5, 7, 0, 3], [4, 0, 0, 0]])
    verdict = walk_tree(tree, targets)
    window = torch.tensor([[100, 101, 102, 103], [200, 201, 202, 203]])   # node i's K/V at slot window[b, i]
    prefix = torch.tensor([3, 1])
    plan = commit_plan(verdict, window, prefix)
    assert plan.window.tolist() == [[100, 101, 103, 102], [200, 201, 202, 203]]
    assert plan.out_tokens.tolist() == [[5, 7, 3, 0], [4, 0, 0, 0]]
    assert plan.commit_lens.tolist() == [3, 2] and plan.commit_lens.dtype == torch.int32
    assert plan.bonus.tolist() == [3, 0]
    assert plan.hidden_rows.tolist() == [[0, 1, 3, 0], [4, 5, 4, 4]]
    assert plan.positions.tolist() == [[3, 4, 5, 6], [1, 2, 3, 4]]
    # the token table: rows 7 and 2 of a pool; afterwards position prefix + j holds path node j's slot
    req_to_token = torch.zeros(10, 12, dtype=torch.int32)
    rewrite_req_to_token(req_to_token, torch.tensor([7, 2]), prefix, plan.window)
    assert req_to_token[7, 3:7].tolist() == [100, 101, 103, 102]
    assert req_to_token[2, 1:5].tolist() == [200, 201, 202, 203]
    assert int(req_to_token.sum()) == sum(range(100, 104)) + sum(range(200, 204))
    # the permutation itself, for another id space of the same window (the draft's KV slots)
    assert torch.equal(window.gather(1, plan.order), plan.window)


def test_window_slots_reads_each_requests_reserved_slots_from_its_token_table_row():
    from ddtree.sglang.step.glue import window_slots

    req_to_token = torch.arange(10 * 12, dtype=torch.int32).view(10, 12)
    slots = window_slots(req_to_token, torch.tensor([7, 2]), torch.tensor([3, 1]), 4)
    assert slots.dtype == torch.int64
    assert slots.tolist() == [list(range(7 * 12 + 3, 7 * 12 + 7)), list(range(2 * 12 + 1, 2 * 12 + 5))]


def test_accept_path_is_verify_trees_walk_and_checks_its_targets():
    from ddtree import build_tree, verify_tree
    from ddtree.verify import accept_path

    g = torch.Generator().manual_seed(3)
    tree = build_tree(torch.randn(2, 3, 11, generator=g), torch.tensor([1, 2]), budget=6, topk_cap=3)
    logits = torch.randn(2, 7, 11, generator=g)
    want = verify_tree(tree, logits, 0.0)
    got = accept_path(tree, logits.argmax(-1))
    for field in ("accepted", "accept_len", "bonus", "tokens"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    with pytest.raises(ValueError, match=r"targets.shape=\(2, 6\) is invalid: expected \(2, 7\)"):
        accept_path(tree, logits.argmax(-1)[:, :6])
    with pytest.raises(ValueError, match="targets.dtype=torch.int32 is invalid"):
        accept_path(tree, logits.argmax(-1).int())
