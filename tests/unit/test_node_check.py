"""Issue 44's tree-against-path check on the CPU: the step dump the worker writes (ddtree.sglang.diagnostics.step_dump) read back
by the GPU test's analysis (testbed/node_check.py), the deliberate sibling fault, and the rule that must
pass a tree whose nodes see exactly their ancestors and fail one whose nodes also see their siblings.

The "model" here is a small causal attention layer run two ways: over the tree with its ancestor mask (as a verify
pass) and over each node's path alone (as a plain run) - the same numbers when the mask is right."""

from __future__ import annotations

import math

import pytest
import torch

from ddtree import switches
from ddtree.sglang.diagnostics.step_dump import Diagnostics, StepDump, leak_siblings
from ddtree.tree import build_tree
from testbed import node_check as nc

V, H = 24, 16


class ToyModel:
    """One attention layer over embeddings with positions; logits of the last attended position."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(V, H, generator=g, dtype=torch.float64)
        self.pos = torch.randn(512, H, generator=g, dtype=torch.float64) * 0.5
        self.wq, self.wk, self.wv = (torch.randn(H, H, generator=g, dtype=torch.float64) / H ** 0.5 for _ in range(3))
        self.out = torch.randn(H, V, generator=g, dtype=torch.float64)

    def run(self, tokens: list[int], positions: list[int], mask: torch.Tensor) -> torch.Tensor:
        """tokens/positions [T], mask bool [T, T] (row i sees column j) -> logits [T, V]."""
        x = self.emb[tokens] + self.pos[positions]
        att = (x @ self.wq) @ (x @ self.wk).T / H ** 0.5
        att = att.masked_fill(~mask, -math.inf).softmax(-1)
        return (att @ (x @ self.wv) + x) @ self.out

    def plain(self, tokens: list[int]) -> torch.Tensor:
        t = len(tokens)
        return self.run(tokens, list(range(t)), torch.ones(t, t, dtype=torch.bool).tril())

    def verify(self, context: list[int], tree) -> torch.Tensor:
        """The tree's N nodes after the context, each seeing the context and tree.ancestor_mask's row -> [N, V]."""
        p, n = len(context), tree.width
        tokens = context + tree.tokens[0].tolist()
        positions = list(range(p)) + (p + tree.depths[0].clamp(min=0)).tolist()
        mask = torch.zeros(p + n, p + n, dtype=torch.bool)
        mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        mask[p:, :p] = True
        mask[p:, p:] = tree.ancestor_mask[0]
        return self.run(tokens, positions, mask)[p:]


def a_tree(seed: int, budget: int = 12, cap: int = 3):
    g = torch.Generator().manual_seed(seed)
    return build_tree(torch.randn(1, 4, V, generator=g), torch.tensor([5]), budget=budget, topk_cap=cap,
                      backend="torch")


def record(model: ToyModel, context: list[int], tree, noise: float = 0.0, seed: int = 0) -> nc.DumpedRequest:
    logits = model.verify(context, tree).float()
    if noise:
        logits = logits + noise * torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed))
    return nc.DumpedRequest(rid="r", step=0, token_ids=context + [int(tree.tokens[0, 0])], prefix=len(context),
                            tree_tokens=tree.tokens[0].tolist(), parents=tree.parents[0].tolist(),
                            depths=tree.depths[0].tolist(), num_nodes=int(tree.num_nodes[0]), logits=logits)


def plain_runs(model: ToyModel, rec: nc.DumpedRequest, noise: float = 0.0, seed: int = 1) -> dict[int, list]:
    """What SGLang 0.5.23's input_top_logprobs gives for each path query (as seen on the H200): one entry per input
    token from logprob_start_len on, the first None, then [[logprob, id, None] x V] after each earlier token."""
    g = torch.Generator().manual_seed(seed)
    runs = {}
    for q in nc.path_queries(rec):
        logits = model.plain(q.input_ids)[q.logprob_start_len: len(q.input_ids) - 1]     # after each path token
        logits = logits + noise * torch.randn(logits.shape, generator=g, dtype=torch.float64)
        logp = torch.log_softmax(logits, -1)
        runs[q.nodes[-1]] = [None] + [[[float(lp), t, None] for t, lp in enumerate(row)] for row in logp]
    return runs


CONTEXT = [3, 7, 1, 9, 4, 4, 2]


def deltas(model, trees, noise=0.0, fault=False):
    out = []
    for i, tree in enumerate(trees):
        rec = record(model, CONTEXT, leak_siblings(tree) if fault else tree, noise, seed=i)
        if fault:       # the dump names the real tree; the pass saw the leaky one
            rec = nc.DumpedRequest(**{**rec.__dict__, "parents": tree.parents[0].tolist()})
        out += nc.request_deltas(rec, plain_runs(model, rec, noise, seed=100 + i)).values()
    return out


def test_a_right_mask_gives_the_plain_runs_logits_at_every_node():
    model = ToyModel()
    tree = a_tree(0)
    d = deltas(model, [tree])
    assert len(d) == int(tree.num_nodes[0])                       # every valid node compared once
    assert max(x.max_abs for x in d) < 1e-5 and all(x.top1_same for x in d)


def test_leaked_siblings_move_the_logits_of_nodes_with_earlier_siblings():
    tree = a_tree(1)
    leaky = leak_siblings(tree)
    parents = tree.parents[0].tolist()
    for i in range(int(tree.num_nodes[0])):
        earlier = {j for j in range(i) if parents[j] == parents[i] and parents[i] >= 0}
        row = leaky.ancestor_mask[0, i]
        assert {j for j in range(tree.width) if row[j]} == {j for j in range(tree.width)
                                                             if tree.ancestor_mask[0, i, j]} | earlier
    d = deltas(ToyModel(), [tree], fault=True)
    assert max(x.max_abs for x in d) > 0.05


def test_the_rule_passes_rounding_like_the_controls_and_fails_the_fault():
    model = ToyModel(3)
    trees = [a_tree(s) for s in range(20)]                        # ~260 nodes
    chains = [a_tree(s, budget=4, cap=1) for s in range(20, 80)]  # 300 nodes
    control = deltas(model, chains, noise=0.01)
    assert nc.compare(deltas(model, trees, noise=0.01), control).passed
    verdict = nc.compare(deltas(model, trees, noise=0.01, fault=True), control)
    assert not verdict.passed and "tree nodes above" in verdict.reason
    assert verdict.over > 0.3


def test_compare_names_each_broken_bound():
    control = [nc.NodeDelta(1, 0.001 * i, 0.0, True, 1.0) for i in range(1, 101)]
    over = [nc.NodeDelta(1, 0.5, 0.0, True, 1.0)] + [nc.NodeDelta(1, 0.001, 0.0, True, 1.0)] * 99
    v = nc.compare(over, control)
    assert not v.passed and "tree max 0.5000 >" in v.reason and "above" not in v.reason
    assert not nc.compare([], control).passed


def test_path_queries_refuse_a_dump_whose_root_is_not_the_next_token():
    tree = a_tree(0)
    rec = record(ToyModel(), CONTEXT, tree)
    bad = nc.DumpedRequest(**{**rec.__dict__, "token_ids": CONTEXT + [int(tree.tokens[0, 0]) + 1]})
    with pytest.raises(ValueError, match="root"):
        nc.path_queries(bad)


class FakePool:
    """The attributes of SGLang's KV pools the dump reads (MLA when kv_lora_rank is set)."""

    def __init__(self, mla: bool, layers: int = 3, size: int = 64):
        self.start_layer, self.layer_num = 0, layers
        g = torch.Generator().manual_seed(7)
        if mla:
            self.kv_lora_rank = 8
            self.k = [torch.randn(size, 1, 12, generator=g) for _ in range(layers)]
            self.v = self.k
        else:
            self.k = [torch.randn(size, 2, 4, generator=g) for _ in range(layers)]
            self.v = [torch.randn(size, 2, 4, generator=g) for _ in range(layers)]

    def get_key_buffer(self, i):
        return self.k[i]

    def get_value_buffer(self, i):
        return self.v[i]


class FakeReq:
    def __init__(self, rid, prompt, output):
        self.rid, self.origin_input_ids, self.output_ids = rid, prompt, output


@pytest.mark.parametrize("mla", [True, False])
def test_the_step_dump_reads_back_as_the_analysis_expects(tmp_path, mla):
    tree = a_tree(2)
    pool = FakePool(mla)
    prefix = torch.tensor([len(CONTEXT)])
    rows = torch.arange(40)[None, :].flip(1)                                  # req_to_token row: pool ids
    logits = torch.randn(tree.width, V)
    dump = StepDump(tmp_path, limit=1)
    dump.write([FakeReq("abc", CONTEXT[:4], CONTEXT[4:] + [int(tree.tokens[0, 0])])], tree, logits, prefix, rows, pool)
    assert not dump.wanted()
    [rec] = nc.load_dumps(tmp_path)
    assert rec.rid == "abc" and rec.context == CONTEXT and rec.tree_tokens == tree.tokens[0].tolist()
    assert torch.equal(rec.logits, logits) and rec.num_nodes == int(tree.num_nodes[0])
    slots = rows[0, : len(CONTEXT)]
    name = "latent" if mla else "key"
    assert torch.equal(rec.kv[name][1], pool.get_key_buffer(1)[slots])
    assert nc.path_queries(rec)                                               # the analysis takes it


def test_kv_delta_separates_prompt_and_answer():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 10, 1, 6, generator=g)
    served = nc.DumpedRequest("a", 3, list(range(11)), 10, [10], [-1], [0], 1, torch.zeros(1, V), {"latent": kv})
    moved = kv.clone()
    moved[1, 7] += 0.5
    prefilled = nc.DumpedRequest("b", 0, list(range(11)), 10, [10], [-1], [0], 1, torch.zeros(1, V),
                                 {"latent": moved})
    d = nc.kv_delta(served, prefilled, prompt_len=4)
    assert d.prompt_max == 0 and d.answer_max > 0.1 and d.worst_position == 7


@pytest.mark.parametrize("env, problem", [({"SGLANG_DDTREE_FAULT": "cousin"}, "SGLANG_DDTREE_FAULT='cousin'"),
                                          ({"SGLANG_DDTREE_DUMP": "rel/dir"}, "absolute"),
                                          ({"SGLANG_DDTREE_DUMP_STEPS": "0"}, "SGLANG_DDTREE_DUMP_STEPS='0'")])
def test_diagnostics_switches_name_a_bad_value(env, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        Diagnostics.from_switches(switches.read(env))


def test_diagnostics_are_off_by_default():
    read = switches.read({})
    d = Diagnostics.from_switches(read)
    assert d.dump_dir is None and read.fault is None


# --- the GPU test's record handling (tests/gpu_sglang/test_node_logits.py), on made-up records ------------------

def made_up(rid: str, prefix: int, width: int, token_ids=()) -> nc.DumpedRequest:
    return nc.DumpedRequest(rid=rid, step=0, token_ids=list(token_ids), prefix=prefix, tree_tokens=[7] * width,
                            parents=[-1] * width, depths=[0] * width, num_nodes=width, logits=torch.zeros(width, 4))


def test_records_take_the_answers_tokens_and_steps_past_the_answer_are_left_out():
    from tests.gpu_sglang.test_node_logits import answered

    lagging = [made_up("a", 3, 4, [1, 2, 3]), made_up("a", 5, 4, [1, 2, 3, 4]), made_up("a", 6, 4, [1, 2, 3, 4]),
               made_up("b", 2, 4, [9, 9])]
    got = answered(lagging, {"a": [1, 2, 3, 4, 5, 6]})
    assert [(r.rid, r.prefix, r.token_ids) for r in got] == [
        ("a", 3, [1, 2, 3, 4, 5, 6]), ("a", 5, [1, 2, 3, 4, 5, 6]), ("b", 2, [9, 9])]   # prefix 6: past the answer


def test_records_are_spread_over_every_width_met():
    from tests.gpu_sglang.test_node_logits import spread_over_widths

    records = [made_up("w65", i, 65) for i in range(30)] + [made_up("w9", i, 9) for i in range(5)] + [made_up("w33", 0, 33)]
    chosen = spread_over_widths(records, 24)
    assert len(chosen) == 24 and {len(r.tree_tokens) for r in chosen} == {9, 33, 65}
    assert [len(r.tree_tokens) for r in chosen[:3]] == [9, 33, 65]
    assert spread_over_widths(records[:30], 24) == records[:24]          # one width: the first, in order


def test_the_drop_leaf_fault_makes_each_trees_last_node_padding_and_leaves_a_lone_root():
    """step_dump.drop_last_node (SGLANG_DDTREE_FAULT=drop-leaf): a chain of 7 loses its depth-7 node, a tree its last
    node (a leaf), a root-only row stays; the result is a tree the verify and verdict take (valid nodes first)."""
    import torch

    from ddtree import build_tree
    from ddtree.sglang.diagnostics.step_dump import drop_last_node
    from ddtree.tree import root_only_tree

    logits = torch.randn(2, 7, 11, generator=torch.Generator().manual_seed(3))
    chain = build_tree(logits, torch.tensor([1, 2]), budget=7, topk_cap=1, backend="torch")
    short = drop_last_node(chain)
    assert short.num_nodes.tolist() == [7, 7] and short.depths[:, 7].tolist() == [-1, -1]
    assert short.depths[:, :7].tolist() == chain.depths[:, :7].tolist() and short.parents[:, 7].tolist() == [-1, -1]
    assert short.tokens[:, 7].tolist() == chain.tokens[:, 0].tolist() and torch.isinf(short.scores[:, 7]).all()
    assert short.ancestor_mask[:, 7].tolist() == [[False] * 7 + [True]] * 2
    assert torch.equal(short.ancestor_mask[:, :7], chain.ancestor_mask[:, :7])
    tree = build_tree(logits, torch.tensor([1, 2]), budget=6, topk_cap=3, backend="torch")
    cut = drop_last_node(tree)
    last = tree.num_nodes - 1
    assert torch.equal(cut.num_nodes, last)
    assert not (tree.parents == last[:, None]).any()                       # the dropped node had no child
    assert (cut.depths.gather(1, last[:, None]) == -1).all()
    alone = root_only_tree(torch.tensor([5, 6]), 7)
    assert torch.equal(drop_last_node(alone).num_nodes, alone.num_nodes)
    assert torch.equal(drop_last_node(alone).ancestor_mask, alone.ancestor_mask)
