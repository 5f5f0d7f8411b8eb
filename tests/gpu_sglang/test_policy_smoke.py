"""The width policy serves requests inside SGLang 0.5.23 (issue 70; marker sglang_gpu; bench/policy_smoke.sh): 16
greedy requests, 8 at a time, on an `auto` server all answer in full, no verify runs eagerly, and /metrics counts the
decode steps of the options the policy chose (the counts recorded)."""

from __future__ import annotations

import pytest

from tests.gpu_sglang.test_ddtree_server import outputs, ready
from tests.gpu_sglang.test_width_policy import STEPS

from testbed import servers as harness
pytestmark = pytest.mark.sglang_gpu


def test_the_policy_serves_requests_smoke(fleet, prompts, record_property):
    server = ready(fleet, "ddtree-auto-c8-graphs")
    got = outputs(server.complete_all(prompts, harness.greedy(64), 8))
    assert [len(o) for o in got] == [64] * len(prompts)
    for _ in range(3):          # the policy's counters are written every 32 decode steps
        outputs(server.complete_all(prompts[:8], harness.greedy(64), 8))
    steps = {option: float(n) for option, n in STEPS.findall(server.metrics())}
    record_property("steps by option", steps)
    assert sum(steps.values()) > 0, "no step counted: the policy did not run"
    assert "DDTREE verify ran eagerly" not in server.log_text()
