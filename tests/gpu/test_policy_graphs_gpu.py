"""The width policy's device work as CUDA graphs (ddtree.sglang.policy.step_policy.PolicyGraphs) on the GPU: what the
graphs put in each step's slot and what they learn equal the eager path's, step by step, with running batches padded
to the captured sizes and options of every width; a deliberate fault (the padding rows left unmasked) is caught."""

from __future__ import annotations

import pytest
import torch

from ddtree.sglang.policy.step_policy import step_policy_for
from ddtree.tree import build_tree_from_candidates
from ddtree.types import Candidates
from ddtree.width_policy import CostCurve

pytestmark = pytest.mark.gpu
DEPTH = 7                                     # a block-8 draft
CHOICES = ((7, 1), (8, 8), (16, 8), (32, 8))  # the chain and auto:8,16,32, cap 8
WIDTHS = (8, 9, 17, 33)
SIZES = (1, 2, 4, 8)                          # the captured batch sizes (SGLang's decode graphs)
RUNNING = [1, 3, 8, 5, 2, 8, 7, 1, 4, 6]      # running batches, most padded to a larger captured size


def policies():
    curve = CostCurve.from_function(lambda b, w: 1.0 + 0.01 * w, SIZES, WIDTHS)
    eager = step_policy_for(CHOICES, 7, curve, DEPTH, 1, "cuda")
    graphed = step_policy_for(CHOICES, 7, curve, DEPTH, 1, "cuda")
    graphed.capture(SIZES)
    return eager, graphed


def random_draft(bs: int, gen: torch.Generator, k: int = 32, vocab: int = 500) -> Candidates:
    """Candidates [bs, L, k], best first, from random logits."""
    logits = torch.randn(bs, DEPTH, vocab, generator=gen, device="cuda") * 3
    top = logits.log_softmax(-1).topk(k, dim=-1)
    return Candidates(logp=top.values, tokens=top.indices)


def step(policy, cand: Candidates, budget: int, cap: int, accept: torch.Tensor) -> torch.Tensor:
    """One step's device work as the worker does it: the step's tree, observe, learn; the slot's values."""
    policy.choose(cand.logp.shape[0])
    roots = torch.zeros(cand.logp.shape[0], dtype=torch.long, device="cuda")
    k = min(cap, cand.logp.shape[-1])
    tree = build_tree_from_candidates(Candidates(cand.logp[..., :k].contiguous(), cand.tokens[..., :k].contiguous()),
                                      roots, budget)
    policy.observe(tree, cand, roots, budget, cap)
    policy.learn(tree, accept)
    torch.cuda.synchronize()                   # the slot's copy to pinned memory is asynchronous
    return policy.slots[(policy.step - 1) % len(policy.slots)].values.clone()


def walk(eager, graphed, fault=None):
    """The same drafts, options and accepted lengths through both policies; the largest difference of the slots."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for i, bs in enumerate(RUNNING):
        budget, cap = CHOICES[i % len(CHOICES)]
        cand = random_draft(bs, gen)
        accept = torch.randint(0, DEPTH + 1, (bs,), generator=gen, device="cuda")
        if fault is not None:
            fault(graphed, bs)
        a, b = step(eager, cand, budget, cap, accept), step(graphed, cand, budget, cap, accept)
        worst = max(worst, float((a - b).abs().max()))
    return worst


def test_the_graphs_fill_each_slot_and_learn_as_the_eager_path_does(record_property):
    eager, graphed = policies()
    assert sorted(graphed.graphs.observe) == list(SIZES)
    assert len(graphed.graphs.learn) == len(SIZES) * len(WIDTHS)
    worst = walk(eager, graphed)
    record_property("largest slot difference", worst)
    assert worst < 1e-5
    for mine, theirs in zip(graphed.policy.calibration.state(), eager.policy.calibration.state()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert float(eager.policy.calibration.steps) == pytest.approx(sum(0.98 ** i for i in range(len(RUNNING))))


def test_a_batch_past_the_captured_sizes_runs_eagerly():
    eager, graphed = policies()
    gen = torch.Generator(device="cuda").manual_seed(1)
    cand = random_draft(12, gen)                                       # past the largest captured size (8)
    accept = torch.randint(0, DEPTH + 1, (12,), generator=gen, device="cuda")
    a, b = step(eager, cand, 32, 8, accept), step(graphed, cand, 32, 8, accept)
    torch.testing.assert_close(a, b)


def test_unmasked_padding_rows_are_caught():
    """The deliberate fault: every padded row counted live (its stale values from a larger batch read as requests);
    the comparison above must fail on it."""
    def unmask(policy, bs):
        for g in policy.graphs.observe.values():
            g.live.fill_(1.0)
            g.live_rows = bs                       # the graph believes the mask is right: it is not rewritten

    eager, graphed = policies()
    assert walk(eager, graphed, fault=unmask) > 1e-3
