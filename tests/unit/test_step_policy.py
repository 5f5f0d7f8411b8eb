"""The width policy as the SGLang worker steps it (issue 70, item 2; CPU, no SGLang): which option a step runs from
the expectations of the step `lag` steps back, the draft's calibration, and the step costs it prices them by - the
table corrected by the steps it measures (ddtree.sglang.policy.step_policy, .graph_timing, .measured_costs)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from ddtree.settings import DDTreeConfigError
from ddtree.sglang.policy.graph_timing import CostTable
from ddtree.sglang.policy.step_policy import step_policy_for
from ddtree.tree import build_tree_from_candidates, root_only_tree
from ddtree.types import Candidates
from ddtree.width_policy import CostCurve

DEPTH = 7                                    # a block-8 draft
CHOICES = ((7, 1), (8, 8), (16, 8), (32, 8))  # the chain and auto:8,16,32 with cap 8
WIDTHS = (8, 9, 17, 33)
BATCHES = (1, 8, 16, 32, 48)


def draft(top1: float, bs: int = 2, k: int = 32, vocab: int = 1000) -> Candidates:
    """Candidates [bs, L, k]: the top-1 token at probability `top1` at every depth, the rest spread evenly."""
    rest = (1.0 - top1) / (k - 1)
    probs = torch.tensor([top1] + [rest] * (k - 1))
    logp = probs.log().expand(bs, DEPTH, k).contiguous()
    tokens = torch.arange(k).expand(bs, DEPTH, k).contiguous() + 10
    return Candidates(logp=logp.float(), tokens=tokens.long())


def two_way_draft(bs: int = 2, k: int = 32) -> Candidates:
    """Candidates [bs, L, k]: two tokens at 0.45 each at every depth (a chain keeps one branch, a tree both)."""
    probs = torch.tensor([0.45, 0.45] + [0.1 / (k - 2)] * (k - 2))
    logp = probs.log().expand(bs, DEPTH, k).contiguous()
    return Candidates(logp=logp.float(), tokens=(torch.arange(k).expand(bs, DEPTH, k) + 10).contiguous().long())


def curve(ms) -> CostCurve:
    return CostCurve.from_function(ms, BATCHES, WIDTHS)


STEEP = curve(lambda b, w: 1.0 + 0.5 * w)        # a wide tree costs far more than it earns
FLAT = curve(lambda b, w: 10.0)                  # width is free


def policy_of(cost: CostCurve, lag: int = 1, share=None, learn: bool = False):
    """The policy priced by the curve alone (learn off; the tests of learning below turn it on) with a clock that
    stands still (with the wall clock a slow or loaded CI machine measured time between the test's steps, which
    made a wide tree cheaper relative to its device cost; CI on 5b314bc picked b8 under STEEP)."""
    policy = step_policy_for(CHOICES, 7, cost, DEPTH, lag, "cpu", share=share, learn_costs=learn)
    policy.clock = lambda: 0.0
    return policy


def run_step(policy, cand: Candidates, bs: int = 2, speculate: bool = False):
    """One decode step as the worker runs it: choose, build the step's tree, observe (a step without speculation:
    the root alone, no draft to observe); returns the option."""
    option = policy.choose(bs, speculate=speculate)
    roots = torch.zeros(cand.logp.shape[0], dtype=torch.long)
    if option.budget == 0:
        return option, root_only_tree(roots, DEPTH)
    k = min(option.cap, cand.logp.shape[-1])
    step_cand = Candidates(logp=cand.logp[..., :k].contiguous(), tokens=cand.tokens[..., :k].contiguous())
    tree = build_tree_from_candidates(step_cand, roots, option.budget)
    policy.observe(tree, cand, roots, option.budget, option.cap)
    return option, tree


def test_the_options_are_the_chain_and_the_trees_narrowest_first():
    policy = policy_of(FLAT)
    assert [(o.name, o.budget, o.cap, o.width) for o in policy.options] == [
        ("chain", 7, 1, 8), ("b8", 8, 8, 9), ("b16", 16, 8, 17), ("b32", 32, 8, 33)]


def test_the_chain_runs_until_the_first_expectations_come_back_then_the_curve_decides():
    flat = policy_of(FLAT, lag=2)
    uncertain = draft(0.35)
    names = [run_step(flat, uncertain)[0].name for _ in range(5)]
    assert names[:2] == ["chain", "chain"]           # steps 0 and 1: nothing read back yet (lag 2)
    assert names[2:] == ["b32"] * 3                  # free width: the widest tree earns the most
    steep = policy_of(STEEP, lag=2)
    assert [run_step(steep, uncertain)[0].name for _ in range(5)] == ["chain"] * 5


def test_a_middling_curve_picks_the_tree_whose_earnings_per_ms_are_highest():
    """The choice equals the argmax computed by hand from the same expectations and costs."""
    middling = curve(lambda b, w: 10.0 + 0.05 * w)
    policy = policy_of(middling)
    cand = draft(0.5)
    run_step(policy, cand)
    option, _ = run_step(policy, cand)
    expected = policy.latest
    costs = [middling.at(2, o.width) for o in policy.options]
    best = max(range(len(costs)), key=lambda i: expected[i] / costs[i])
    assert option == policy.options[best]
    assert option.name not in ("chain", "b32")       # neither end: the curve is neither steep nor flat
    assert expected == sorted(expected)              # the chain earns least, each wider tree more


def test_a_step_reads_the_expectations_of_exactly_lag_steps_back():
    policy = policy_of(FLAT, lag=1)
    confident, uncertain = draft(0.95), draft(0.2)
    run_step(policy, confident)
    run_step(policy, uncertain)           # reads step 0 (confident)
    after_confident = list(policy.latest)
    run_step(policy, uncertain)           # reads step 1 (uncertain)
    assert policy.latest != after_confident
    assert policy.latest[0] < after_confident[0]      # the uncertain draft's chain earns less


def test_an_overconfident_draft_is_corrected_by_its_calibration():
    """The draft says 0.45 for each of two tokens at every depth but nothing is ever accepted: learn() drives the
    scale down, the expectations with it, and the policy moves from the widest tree to a narrower option."""
    middling = curve(lambda b, w: 10.0 + 0.05 * w)
    policy = policy_of(middling)
    cand = two_way_draft()
    chosen, believed = [], []
    for _ in range(40):
        option, tree = run_step(policy, cand)
        chosen.append(policy.options.index(option))
        believed.append(list(policy.latest))
        policy.learn(tree, torch.zeros(2, dtype=torch.long))
    scale = policy.policy.calibration.scale()
    assert scale[1:].max() < 0.2
    assert chosen[1] == len(policy.options) - 1       # trusted at first: the widest tree
    assert chosen[-1] < chosen[1]                     # corrected: a narrower option
    assert believed[-1][-1] - 1 < 0.2 * (believed[1][-1] - 1)   # b32's expected draft tokens cut by > 80%


def test_steps_every_12_ms_whatever_their_width_make_every_width_cost_the_same():
    """A host-bound server under the overlap scheduler: a step every 12 ms whatever it runs. Once measured, every
    option is priced at 12 ms and the widest tree (the most expected tokens) wins; priced by the device table alone
    (nothing measured) the same draft buys a narrower one."""
    table = curve(lambda b, w: 1.0 + 0.3 * w)        # 3.4 ms (chain) .. 10.9 ms (b32)
    host_bound = policy_of(table, lag=2, learn=True)
    clock = iter(x * 0.012 for x in range(1000))              # a decode step every 12 ms
    host_bound.clock = lambda: next(clock)
    device_only = policy_of(table)
    cand = draft(0.5)
    names = [run_step(host_bound, cand)[0].name for _ in range(40)]
    assert names[-10:] == ["b32"] * 10
    costs = host_bound.measured.priced(2, host_bound.policy.costs(2))
    assert costs == pytest.approx([12.0] * 4)
    run_step(device_only, cand)
    assert run_step(device_only, cand)[0].name != "b32"


class StepClock:
    """A server's clock as the policy sees it: the time between two decode steps' starts is the true cost of the
    step `offset` back (0 without the overlap scheduler; 1 with it: the period waits for the step before)."""

    def __init__(self, true_ms, offset: int = 0):
        self.true_ms, self.offset, self.now, self.ran = true_ms, offset, 0.0, []

    def __call__(self) -> float:
        if len(self.ran) > self.offset:
            self.now += self.true_ms(self.ran[-1 - self.offset]) / 1e3
        return self.now

    def step(self, policy, cand, bs: int = 2):
        option, tree = run_step(policy, cand, bs=bs)
        self.ran.append(option.name)
        return option, tree


# the rank-sized pair's steps at one request (H100, 2026-12-07): the table against what the server's steps took
RIG_TABLE = CostCurve.from_function(lambda b, w: {1: 3.93, 8: 4.19, 9: 4.66, 17: 4.99, 33: 5.59}[w], BATCHES,
                                   (1,) + WIDTHS)
RIG_TRUE = {"none": 5.7, "chain": 12.5, "b8": 14.0, "b16": 15.5, "b32": 17.4}


@pytest.mark.parametrize("lag", [1, 2])
def test_a_table_that_prices_width_as_nearly_free_is_corrected_by_the_measured_steps(lag):
    """Priced by the table the chain earns most per ms (2.0 tokens for 4.19 ms); measured, no speculation does (1
    token for 5.7 ms against the chain's 2.0 for 12.5): after each option has run the policy settles on it,
    re-measuring the others seldom, and its modelled tokens per ms is within 3% of the best option's."""
    policy = step_policy_for(((0, 1),) + CHOICES, 7, RIG_TABLE, DEPTH, lag, "cpu")
    clock = StepClock(RIG_TRUE.__getitem__, offset=lag - 1)
    policy.clock = clock
    cand = draft(0.5)
    for _ in range(400):
        clock.step(policy, cand, bs=1)
    late = clock.ran[100:]
    assert late.count("none") / len(late) > 0.85, {n: late.count(n) for n in RIG_TRUE}
    earned = {o.name: e for o, e in zip(policy.options, policy.latest)}
    best = max(earned[n] / RIG_TRUE[n] for n in RIG_TRUE)
    served = sum(earned[n] for n in late) / sum(RIG_TRUE[n] for n in late)
    assert served >= 0.97 * best
    ratios = {policy.options[i].name: r for (b, i), r in policy.measured.shared.items() if b == 1}
    assert ratios["b32"] == pytest.approx(17.4 / 5.59, rel=0.05) and ratios["none"] == pytest.approx(5.7 / 3.93,
                                                                                                     rel=0.05)


def test_with_learning_off_the_table_alone_prices_the_widths():
    policy = step_policy_for(((0, 1),) + CHOICES, 7, RIG_TABLE, DEPTH, 1, "cpu", learn_costs=False)
    clock = StepClock(RIG_TRUE.__getitem__)
    policy.clock = clock
    for _ in range(60):
        clock.step(policy, draft(0.5), bs=1)
    assert clock.ran == ["chain"] * 60                   # the table's best (2.0 tokens for 4.19 ms), not the truth's
    assert policy.measured.shared == {}


def test_a_clearly_worse_option_is_re_measured_seldom_and_a_close_one_often():
    """Every option runs once at a band; then an option scoring s of the best is due every retry / s steps: the
    chain (0.91 of no speculation's tokens per ms here) about every 70, b32 (0.17: 60 ms a step) about every 380.
    No refresh steps (refresh_every past the run) so that only the re-measuring runs the others."""
    true_ms = dict(RIG_TRUE, b32=60.0)
    policy = step_policy_for(((0, 1),) + CHOICES, 7, RIG_TABLE, DEPTH, 1, "cpu")
    policy.refresh_every = 10_000
    clock = StepClock(true_ms.__getitem__)
    policy.clock = clock
    for _ in range(1000):
        clock.step(policy, draft(0.5), bs=1)
    counts = {n: clock.ran.count(n) for n in true_ms}
    assert counts["none"] > 940
    assert 10 <= counts["chain"] <= 20, counts
    assert 2 <= counts["b32"] <= 5, counts


def test_a_new_band_runs_each_option_once_then_prices_by_its_own_measurements():
    policy = step_policy_for(((0, 1),) + CHOICES, 7, RIG_TABLE, DEPTH, 1, "cpu")
    clock = StepClock(RIG_TRUE.__getitem__)
    policy.clock = clock
    for _ in range(50):
        clock.step(policy, draft(0.5), bs=1)
    before = len(clock.ran)
    for _ in range(12):
        clock.step(policy, draft(0.5), bs=8)
    at_eight = clock.ran[before:]
    assert set(at_eight) == set(RIG_TRUE)                            # every option run once at the new band
    assert {policy.options[i].name for (b, i) in policy.measured.shared if b == 4} == set(RIG_TRUE)


def test_an_idle_gap_or_a_prefill_between_two_steps_is_not_measured():
    policy = policy_of(FLAT, learn=True)
    times = iter([0.0, 0.010, 5.0, 5.010, 5.020])
    policy.clock = lambda: next(times)
    cand = draft(0.5)
    run_step(policy, cand)
    run_step(policy, cand)                               # 10 ms after the first: measured
    assert list(policy.measured.local.values()) == [pytest.approx(1.0)]
    run_step(policy, cand)                               # 4990 ms later: an idle gap
    assert list(policy.measured.samples.values()) == [1]
    policy.interrupted()                                 # a prefill ran
    run_step(policy, cand)
    assert sum(policy.measured.samples.values()) == 1


def test_every_rank_prices_with_rank_0s_ratios_taken_every_share_every_steps():
    """Two ranks whose clocks disagree choose alike: each prices with what `share` returned (rank 0's), taken
    every share_every steps, never with its own."""
    from ddtree.sglang.policy.measured_costs import BANDS

    rank0 = {}
    shared = []

    def share_of(rank):
        def share(values):
            if rank == 0:
                rank0["values"] = list(values)
            shared.append(rank)
            return rank0["values"]
        return share

    ranks = []
    for rank, speed in ((0, 1.0), (1, 3.0)):
        p = step_policy_for(((0, 1),) + CHOICES, 7, RIG_TABLE, DEPTH, 1, "cpu", share=share_of(rank))
        p.share_every = 4
        p.clock = StepClock(lambda n, s=speed: RIG_TRUE[n] * s)
        ranks.append(p)
    for _ in range(40):                                  # rank 0 first at each step, as broadcast's source
        names = [p.clock.step(p, draft(0.5), bs=1)[0].name for p in ranks]
        assert names[0] == names[1]
    assert shared.count(0) == shared.count(1) == 10
    assert len(rank0["values"]) == BANDS * len(ranks[0].options)
    assert ranks[1].measured.shared == ranks[0].measured.shared != ranks[1].measured.local


# --- no speculation as an option -------------------------------------------------------------------------------

WITH_NONE = ((0, 1),) + CHOICES
TOKENS = CostCurve.from_function(lambda b, w: 1.0 + 0.02 * b * w, BATCHES, (1,) + WIDTHS)   # cost per verified token


def none_policy(cost: CostCurve = TOKENS, lag: int = 1, refresh_every: int = 16):
    policy = step_policy_for(WITH_NONE, 7, cost, DEPTH, lag, "cpu", learn_costs=False)
    policy.clock = lambda: 0.0
    policy.refresh_every = refresh_every
    return policy


def test_no_speculation_is_the_first_option_at_width_1():
    assert [(o.name, o.budget, o.width) for o in none_policy().options][:2] == [("none", 0, 1), ("chain", 7, 8)]


def test_a_batch_whose_verify_cost_grows_with_its_tokens_stops_speculating_and_a_small_one_does_not():
    """One curve, two loads: at 1 request the chain's ~2 tokens for 1.16 ms beat one token for 1.02 ms; at 48 a
    verified token costs so much that one token for 1.96 ms beats the chain's ~2 for 8.7 ms."""
    cand = draft(0.5)
    small, large = none_policy(), none_policy()
    assert [run_step(small, cand, bs=1)[0].name for _ in range(4)][1:] == ["chain"] * 3
    assert [run_step(large, cand, bs=48)[0].name for _ in range(4)][1:] == ["none"] * 3
    expected, costs = large.latest, TOKENS
    assert expected[0] == pytest.approx(1.0)                          # no speculation: the bonus alone
    assert expected[0] / costs.at(48, 1) > max(e / costs.at(48, o.width) for e, o in zip(expected, large.options)
                                                if o.budget > 0)


def test_after_refresh_every_unspeculated_steps_one_step_speculates_to_read_the_draft_again():
    policy = none_policy(refresh_every=3)
    names = [run_step(policy, draft(0.5), bs=48)[0].name for _ in range(10)]
    assert names == ["chain", "none", "none", "none", "chain", "none", "none", "none", "chain", "none"], names


def test_a_batch_with_a_grammar_always_speculates():
    policy = none_policy()
    names = [run_step(policy, draft(0.5), bs=48, speculate=True)[0].name for _ in range(5)]
    assert "none" not in names and names[1:] == ["chain"] * 4


def test_a_step_without_speculation_teaches_the_calibration_nothing():
    policy = none_policy()
    before = policy.policy.calibration.state()
    policy.learn(root_only_tree(torch.zeros(2, dtype=torch.long), DEPTH), torch.zeros(2, dtype=torch.long))
    assert all(torch.equal(a, b) for a, b in zip(before, policy.policy.calibration.state()))


def test_a_step_without_speculation_costs_the_verify_alone():
    t = CostTable({(b, w): 0.1 * w + 0.05 * b for b in (1, 8) for w in (1, 8)}, {1: 0.5, 8: 0.7})
    assert t.step_ms(8, 1) == pytest.approx(t.verify_ms[(8, 1)])                  # no draft pass
    assert t.step_ms(8, 8) == pytest.approx(t.verify_ms[(8, 8)] + 0.7)


def test_a_table_without_width_1_leaves_no_speculation_out_and_says_so(caplog):
    caplog.set_level("WARNING")
    policy = step_policy_for(WITH_NONE, 7, STEEP, DEPTH, 1, "cpu")
    assert "none" not in [o.name for o in policy.options]
    assert "no width 1" in caplog.text


def test_the_test_beds_steep_table_speculates_at_one_request_and_not_at_two():
    """The GPU test's -steepcost server (testbed/costs-steep.json) must run both kinds of step: a tree at one
    request, no speculation at 2-8 requests, whatever the test bed's steps take (0 and 5 ms here): the server prices
    by the table alone (SGLANG_DDTREE_COST_LEARN=0)."""
    from testbed.servers import STEEP_COSTS

    for host_ms in (0.0, 5.0):
        policy = step_policy_for(WITH_NONE, 7, CostTable.read(STEEP_COSTS).curve(), DEPTH, 1, "cpu",
                                 learn_costs=False)                    # as servers.py starts it
        ticks = iter(range(100))
        policy.clock = lambda: next(ticks) * host_ms / 1e3
        cand = draft(0.6)
        assert run_step(policy, cand, bs=1)[0].name == "chain"             # nothing read back yet
        assert run_step(policy, cand, bs=1)[0].budget > 0
        assert {run_step(policy, cand, bs=b)[0].name for b in range(2, 9)} == {"none"}


def test_a_lag_below_one_is_refused():
    with pytest.raises(ValueError, match="lag=0"):
        policy_of(FLAT, lag=0)


# --- the step costs ---------------------------------------------------------------------------------------------

def table() -> CostTable:
    verify = {(b, w): 0.1 * w + 0.05 * b for b in (1, 8, 16) for w in (8, 9, 17)}
    return CostTable(verify, {1: 0.5, 8: 0.7, 16: 1.0}, seconds=3.2)


def test_a_step_costs_the_draft_plus_the_verify_of_its_width():
    t = table()
    assert t.step_ms(8, 17) == pytest.approx(0.1 * 17 + 0.05 * 8 + 0.7)
    assert t.step_ms(5, 9) == pytest.approx(t.verify_ms[(8, 9)] + 0.7)          # padded up to the captured 8
    assert t.step_ms(32, 8) == pytest.approx((t.verify_ms[(16, 8)] + 1.0) * 2)   # past the largest: in proportion
    assert t.lines()[0].startswith("DDTREE step cost, ms of one replay (start-up, timed in 3.2 s)")
    assert any(line.strip().startswith("width 17") and "bs16=" in line for line in t.lines())


def test_a_table_round_trips_through_json_and_a_bad_file_is_named(tmp_path):
    t = table()
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(t.to_json()))
    back = CostTable.read(path)
    assert back.verify_ms == pytest.approx(t.verify_ms) and back.draft_ms == t.draft_ms
    assert back.source == str(path)
    path.write_text(json.dumps({"verify_ms": [[1, 9]]}))
    with pytest.raises(DDTreeConfigError, match=r"the cost table .*costs.json is invalid.*verify_ms"):
        CostTable.read(path)
    path.write_text(json.dumps({"verify_ms": [[1, 9, 0.0]]}))
    with pytest.raises(DDTreeConfigError, match=r"\(1, 9\).*expected a time > 0"):
        CostTable.read(path)
    with pytest.raises(DDTreeConfigError, match="SGLANG_DDTREE_COST_TABLE=.*missing.json cannot be read"):
        CostTable.read(tmp_path / "missing.json")


def test_a_policy_refuses_a_table_that_cannot_price_one_of_its_widths():
    partial = CostTable({(1, 9): 1.0, (1, 17): 2.0})
    with pytest.raises(DDTreeConfigError, match=r"width=33.*no cost measured at this width"):
        step_policy_for(((8, 8), (32, 8)), None, partial.curve(), DEPTH, 1, "cpu")
    assert math.isclose(partial.step_ms(1, 9), 1.0)


def test_the_policy_numbers_reach_a_multiprocess_registry(tmp_path, monkeypatch):
    """What rank 0 writes is what SGLang's /metrics collects from its schedulers' files (prometheus-client's
    multiprocess collector); other ranks and servers without --enable-metrics write nothing."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(prometheus_client.values, "ValueClass", prometheus_client.values.get_value_class())
    from ddtree.sglang.policy import policy_metrics

    assert policy_metrics.PolicyMetrics.create(table(), rank=1, enabled=True) is None
    assert policy_metrics.PolicyMetrics.create(table(), rank=0, enabled=False) is None
    metrics = policy_metrics.PolicyMetrics.create(table(), rank=0, enabled=True)
    policy = policy_of(FLAT)
    for _ in range(policy_metrics.PUBLISH_EVERY + 1):
        run_step(policy, draft(0.5))
        metrics.maybe_publish(policy)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    assert 'sglang:ddtree_step_cost_ms{batch="8",width="17"} ' + str(table().step_ms(8, 17)) in text
    assert 'sglang:ddtree_policy_steps_total{option="chain"} 1.0' in text          # step 0: nothing read back yet
    assert 'sglang:ddtree_policy_steps_total{option="b32"} 31.0' in text           # the 32 steps published so far
    assert 'sglang:ddtree_draft_calibration{depth="1"} 1.0' in text                 # nothing learnt: trusted
    assert re.search(r'sglang:ddtree_expected_tokens\{option="b16"\} 2\.1\d*', text)


def test_the_measured_corrections_reach_the_registry(tmp_path, monkeypatch):
    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(prometheus_client.values, "ValueClass", prometheus_client.values.get_value_class())
    from ddtree.sglang.policy import policy_metrics

    for name in ("sglang:ddtree_step_cost_ms", "sglang:ddtree_policy_steps", "sglang:ddtree_expected_tokens",
                 "sglang:ddtree_draft_calibration", "sglang:ddtree_cost_correction"):   # another test's, if it ran
        collector = prometheus_client.REGISTRY._names_to_collectors.get(name)
        if collector is not None:
            prometheus_client.REGISTRY.unregister(collector)
    metrics = policy_metrics.PolicyMetrics.create(table(), rank=0, enabled=True)
    policy = step_policy_for(((0, 1),) + CHOICES, 7, RIG_TABLE, DEPTH, 1, "cpu")
    clock = StepClock(RIG_TRUE.__getitem__)
    policy.clock = clock
    for _ in range(policy_metrics.PUBLISH_EVERY + 1):
        clock.step(policy, draft(0.5), bs=1)
        metrics.maybe_publish(policy)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    found = re.search(r'sglang:ddtree_cost_correction\{band="1",option="b32"\} ([0-9.]+)', text)
    assert found and float(found.group(1)) == pytest.approx(17.4 / 5.59, rel=0.05)
