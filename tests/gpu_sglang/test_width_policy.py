"""The width policy inside SGLang 0.5.23 (issue 70, items 1-3; marker sglang_gpu).

Servers: ddtree-auto-c8-graphs (`--speculative-ddtree-budget auto`: no speculation, the chain and the trees 8, 16, 32,
cap 8) and its -overlap twin, beside NONE; ddtree-auto-c8-graphs-steepcost, the same priced by a made-up table under
which a verified token is dear (testbed/costs-steep.json), so that its steps without speculation run at 2+ requests.
What is checked, each able to fail:
- start-up: every captured verify graph (widths 1, 8, 9, 17, 33) and the draft's timed before the server is ready,
  the table in the log and on /metrics, the seconds it took recorded; no eager verify afterwards;
- the policy runs: after traffic /metrics counts the decode steps of each option (recorded: which widths ran); on the
  -steepcost server both steps without speculation and speculative ones ran;
- temperature 0: NONE's tokens (partings only at bf16 near ties, judged by the referee) one by one, 8 at once and
  with requests arriving at staggered times, so the width changes mid-answer;
- temperature 0.7: the 4th token's distribution matches NONE's, with its control (temperature 1.0) rejected.
"""

from __future__ import annotations

import random
import re

import pytest

from tests.gpu_sglang.test_ddtree_server import SAMPLING, compare_with_plain, entropy, mean_accept, outputs, ready
from tests.gpu_sglang.test_ddtree_server import exact, none_greedy, reference  # noqa: F401  (fixtures)
from tests.gpu_sglang.test_overlap import staggered
from tests.gpu_sglang.test_widths import SAMPLES, fourth
from tests.helpers import two_sample_chi_square_pvalue

from testbed import servers as harness
pytestmark = pytest.mark.sglang_gpu

AUTO = ["ddtree-auto-c8-graphs", "ddtree-auto-c8-graphs-overlap"]
STEEP = "ddtree-auto-c8-graphs-steepcost"
WIDTHS = [1, 8, 9, 17, 33]               # no speculation, the chain (a block-8 draft) and auto's trees 8, 16, 32
COST_LINE = re.compile(r"DDTREE step cost, ms of one replay \((start-up[^,]*), timed in ([\d.]+) s\)")
ROW = re.compile(r"^(?:\[[^\]]*\])?\s*width (\d+)\s+(bs\d+=.*)$", re.MULTILINE)   # after the log's [time] prefix
STEPS = re.compile(r'^sglang:ddtree_policy_steps_total\{option="([a-z0-9]+)"\} ([\d.e+]+)$', re.MULTILINE)


def cost_rows(log: str) -> dict[int, dict[int, float]]:
    """width -> {batch: ms} from the start-up table in a server log."""
    return {int(w): {int(b): float(ms) for b, ms in re.findall(r"bs(\d+)=([\d.]+)", cells)}
            for w, cells in ROW.findall(log)}


@pytest.mark.parametrize("name", AUTO)
def test_every_verify_graph_is_timed_before_the_server_is_ready(fleet, name, record_property):
    server = ready(fleet, name)
    log = server.log_text()
    found = COST_LINE.search(log)
    assert found, "no step cost table in the log"
    record_property("timed in s", float(found.group(2)))
    rows = cost_rows(log)
    record_property("ms at bs 1 by width", {w: rows[w].get(1) for w in sorted(rows)})
    assert sorted(rows) == WIDTHS
    assert all(ms > 0 for row in rows.values() for ms in row.values())
    assert "DDTREE width policy: none, chain, b8, b16, b32" in log
    metrics = server.metrics()
    assert 'sglang:ddtree_step_cost_ms{batch="1",width="33"}' in metrics


@pytest.mark.parametrize("name", AUTO + [STEEP])
def test_greedy_equals_none_with_the_policy_on(fleet, name, prompts, none_greedy, exact, record_property):
    plain, server = ready(fleet, "none"), ready(fleet, name)
    wrong, identical, ties = [], 0, []
    one_by_one = server.complete_all(prompts, harness.greedy(), 1)
    eight = server.complete_all(prompts, harness.greedy(), 8)
    for mode, got in (("one by one", outputs(one_by_one)), ("8 at once", outputs(eight))):
        same, gaps, differences = compare_with_plain(plain, prompts, none_greedy, got, exact)
        identical += same
        ties += gaps
        wrong += [(mode, i, d) for i, d in differences]
    rng = random.Random(5)
    asks = [(prompts[i % len(prompts)], rng.choice([12, 40, 90, 128])) for i in range(24)]
    want = [w[:n] for w, (_, n) in zip(outputs(plain.complete_all([p for p, _ in asks], harness.greedy(128), 8)),
                                       asks)]
    same, gaps, differences = compare_with_plain(plain, [p for p, _ in asks], want, outputs(staggered(server, asks, 6)),
                                                 exact)
    identical += same
    ties += gaps
    wrong += [("staggered", i, d) for i, d in differences]
    steps = {option: float(n) for option, n in STEPS.findall(server.metrics())}
    record_property("identical to NONE", f"{identical}/{2 * len(prompts) + len(asks)}")
    record_property("near ties re-anchored", ties)
    record_property("accept length (one by one)", round(mean_accept(one_by_one), 3))
    record_property("steps by option", steps)
    assert not wrong, wrong
    assert len([n for n in steps.values() if n > 0]) >= 1 and sum(steps.values()) > 0, steps
    if name == STEEP:       # the steps without speculation ran, and speculative ones beside them
        assert steps.get("none", 0) > 0 and sum(n for o, n in steps.items() if o != "none") > 0, steps


def test_sampling_matches_none_with_the_policy_on(fleet, prompts, record_property):
    none, tree = ready(fleet, "none"), ready(fleet, AUTO[0])
    prompt = max(prompts[:8], key=lambda p: entropy(fourth(none, p, SAMPLING, 200, 8)))
    plain = fourth(none, prompt, SAMPLING, SAMPLES, 8)
    spec = fourth(tree, prompt, SAMPLING, SAMPLES, 8)
    hot = fourth(tree, prompt, {**SAMPLING, "temperature": 1.0}, SAMPLES, 8)
    p_same = two_sample_chi_square_pvalue(plain, spec)
    p_control = two_sample_chi_square_pvalue(plain, hot)
    record_property("p (policy vs NONE)", round(p_same, 4))
    record_property("p (control: temperature 1.0)", p_control)
    assert p_control < 1e-3, "the control was not told apart: the test cannot judge"
    assert p_same > 1e-3
