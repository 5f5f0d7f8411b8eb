"""ddtree.width_policy (issue 70): the expected accepted length of every budget read off the widest tree equals the
best tree of that budget's own; the chain's likewise; the calibration learns an overconfident draft; the choice follows
the cost curve; and, on the reference engine's models along their greedy continuations, the policy's modelled
tokens per second is within 3% of the best fixed option for a steep, a middling and a flat cost curve."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from ddtree import build_tree
from ddtree.reference.offline import modelled_tokens_per_s, offline_policy_steps
from ddtree.tree import build_tree_from_candidates, draft_candidates
from ddtree.width_policy import (Calibration, CostCurve, WidthPolicy, chain_expectation, node_values, options_for,
                                 tree_expectations)
from tests.reference.conftest import small_vocab_pair

torch.manual_seed(0)
LOGITS = torch.randn(3, 5, 40) * 2.0          # [bs, L, V]
ROOTS = torch.tensor([1, 2, 3])


def test_each_budgets_expectation_is_the_sum_over_the_best_tree_of_that_budget():
    wide = build_tree(LOGITS, ROOTS, budget=32, topk_cap=8)
    budgets = torch.tensor([1, 3, 8, 17, 32])
    got = tree_expectations(wide, budgets)                                             # [bs, 5]
    for j, b in enumerate(budgets.tolist()):
        own = build_tree(LOGITS, ROOTS, budget=b, topk_cap=8)
        torch.testing.assert_close(got[:, j], node_values(own).sum(-1))
    assert torch.all(got[:, 1:] >= got[:, :-1])                                         # wider never earns less


def test_the_chains_expectation_is_its_own_trees_and_budget_zero_earns_nothing():
    cand = draft_candidates(LOGITS, 8)
    chain = build_tree(LOGITS, ROOTS, budget=5, topk_cap=1)
    torch.testing.assert_close(chain_expectation(cand), node_values(chain).sum(-1))
    wide = build_tree_from_candidates(cand, ROOTS, 8)
    assert torch.all(tree_expectations(wide, torch.tensor([0])) == 0)


def test_the_calibration_learns_what_an_overconfident_draft_delivers():
    tree = build_tree(LOGITS, ROOTS, budget=16, topk_cap=4)
    cal = Calibration(depth=5, decay=0.9)
    assert torch.allclose(cal.scale(), torch.ones(6))                                  # trusted until it learns
    for _ in range(60):
        cal.update(tree, torch.zeros(3, dtype=torch.int64))                           # nothing ever accepted
    scale, reached = cal.scale(), sorted(set(tree.depths.flatten().tolist()) - {-1, 0})
    assert scale[0] == 1 and torch.all(scale[reached] < 0.5)
    assert torch.all(scale[max(reached) + 1:] == 1)                                   # no node there: nothing learnt
    honest = Calibration(depth=5, decay=0.9)
    for _ in range(60):
        honest.update(tree, torch.full((3,), 5))                                       # everything accepted
    assert torch.all(honest.scale()[reached] > 1)


def test_the_choice_follows_the_cost_curve_and_a_width_without_a_cost_is_refused_by_name():
    opts = options_for((4, 16), depth=5, cap=8)
    assert [o.name for o in opts] == ["none", "chain", "b4", "b16"] and [o.width for o in opts] == [1, 6, 5, 17]
    cand = draft_candidates(LOGITS, 8)
    wide = build_tree_from_candidates(cand, ROOTS, 16)
    steep = CostCurve.from_function(lambda b, w: 1 + 2.0 * (w - 1), [1, 4], [1, 5, 6, 17])
    flat = CostCurve.from_function(lambda b, w: 1 + 0.001 * (w - 1), [1, 4], [1, 5, 6, 17])
    assert opts[int(WidthPolicy(opts, steep).plan(wide, cand, batch=3))].name == "none"
    assert opts[int(WidthPolicy(opts, flat).plan(wide, cand, batch=3))].name == "b16"
    assert steep.at(3, 5) == steep.at(4, 5) and steep.at(8, 5) == pytest.approx(2 * steep.at(4, 5))
    with pytest.raises(ValueError, match=r"width=17 .*no cost measured at this width \(measured: \[1, 5, 6\]\)"):
        WidthPolicy(opts, CostCurve.from_function(lambda b, w: 1.0, [1], [1, 5, 6]))
    with pytest.raises(ValueError, match="tree width"):
        WidthPolicy(opts, flat).plan(build_tree_from_candidates(cand, ROOTS, 4), cand, batch=1)


CURVES = {"steep": lambda w: 1 + 0.5 * (w - 1), "middling": lambda w: 1 + 0.06 * (w - 1),
          "flat": lambda w: 1 + 0.003 * (w - 1)}


@pytest.fixture(scope="module")
def walk():
    pair = small_vocab_pair(vocab=8, seed=0, std=0.2, block_size=4)
    rng = random.Random(0)
    prompt = [0] + [rng.randrange(2, 8) for _ in range(6)]
    continuation = pair.target.greedy_continue(torch.tensor([prompt]), 300)[0, len(prompt):].tolist()
    return pair, prompt, continuation


@pytest.mark.parametrize("curve", sorted(CURVES))
def test_the_policys_modelled_speed_is_within_3_percent_of_the_best_fixed_option(walk, curve):
    pair, prompt, continuation = walk
    ms = CURVES[curve]
    opts = options_for((2, 4, 8, 16), depth=3, cap=4)
    table = CostCurve.from_function(lambda b, w: ms(w), [1], [o.width for o in opts])
    fixed = {o.name: modelled_tokens_per_s(offline_policy_steps(pair, prompt, continuation,
                                                                WidthPolicy((o,), table), 60, first=0), ms)
             for o in opts}
    steps = offline_policy_steps(pair, prompt, continuation, WidthPolicy(opts, table, Calibration(3)), 60)
    mine = modelled_tokens_per_s(steps, ms)
    best = max(fixed, key=fixed.get)
    chosen = Counter(s.option for s in steps).most_common(1)[0][0]
    assert mine >= 0.97 * fixed[best], (curve, mine, fixed)
    widest, narrowest = opts[-1].name, opts[0].name
    assert chosen == {"steep": narrowest, "flat": widest}.get(curve, chosen), (curve, Counter(s.option for s in steps))
