"""DDTREE on the real kind of routing (top 2 of 8 experts) as a statistical run (issue 44, item 3; marker sglang_gpu).

On a target whose routing bf16 can flip, SGLang's own DFLASH parts from plain decoding well past one bf16 step, so
identity is not decidable there (the pairs with dense MLPs and with every expert active decide it: test_ddtree_server,
test_node_logits). Here DDTREE's answers and SGLang's DFLASH's on the same prompts are each walked against plain
decoding to their end (testbed/partings.py): partings per 1,000 tokens, the float32 referee's real
differences per 1,000 tokens, and the partings' bf16 gaps; DDTREE must be no worse than DFLASH by three one-sided tests
at alpha 0.01. The deliberate tree-mask fault (every earlier sibling visible) must fail the same rule, or the run
cannot tell a fault from rounding and the test says so.

Prompts: all the pair's held-out prompts (32 from train_pair --prompts 32), 128 tokens each, one request at a time
and 8 at once (both counted). Skipped on a pair whose routing cannot flip (testbed/decide.sh part moe starts
it on the top-2-of-8 pair).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from testbed.partings import PlainModel, Tally, compare, walk_answer
from tests.gpu_sglang.test_ddtree_server import exact, is_moe, outputs, ready, reference  # noqa: F401  (fixtures)
from tests.gpu_sglang.test_ddtree_server import plain_decoding

from testbed import servers as harness

pytestmark = pytest.mark.sglang_gpu

TREE, CONTROL, FAULT = "ddtree-b32-c8-graphs", "dflash", "ddtree-b32-c8-graphs-fault"
MOE_SERVERS = ("none", CONTROL, TREE, FAULT)
MODES = {"one by one": 1, "8 at once": 8}


@pytest.fixture(scope="session")
def moe_pair(reference):
    if not is_moe(reference):
        pytest.skip("the pair's routing cannot flip (dense MLPs or every expert active): identity decides it")
    return reference


@pytest.fixture(scope="session")
def moe_prompts() -> list[list[int]]:
    """Every held-out prompt: <bos> + the first 16, 23, 30, ... bytes (lengths as the other tests', more of them)."""
    raw = json.loads(Path(os.environ["SGLANG_DDTREE_PROMPTS"]).read_text())
    return [p[: 1 + 16 + 7 * i] for i, p in enumerate(raw)]


@pytest.fixture(scope="session")
def plain_answers(moe_pair, fleet, moe_prompts) -> list[list[int]]:
    return outputs(ready(fleet, "none").complete_all(moe_prompts, harness.greedy(), 1))


@pytest.fixture(scope="session")
def plain_model(moe_pair, fleet, exact) -> PlainModel:
    return plain_decoding(ready(fleet, "none"), exact)


def tally(fleet, name: str, plain_model: PlainModel, prompts, want) -> Tally:
    """Server `name`'s answers (one by one, then 8 at once), every one walked against plain decoding."""
    server, result = ready(fleet, name), Tally(name)
    for concurrency in MODES.values():
        have = outputs(server.complete_all(prompts, harness.greedy(), concurrency))
        with ThreadPoolExecutor(max_workers=8) as pool:
            for walk in pool.map(lambda i: walk_answer(plain_model, prompts[i], want[i], have[i]), range(len(prompts))):
                result.add(walk)
    return result


@pytest.fixture(scope="session")
def control_tally(fleet, plain_model, moe_prompts, plain_answers) -> Tally:
    return tally(fleet, CONTROL, plain_model, moe_prompts, plain_answers)


def record(record_property, *tallies: Tally) -> None:
    for t in tallies:
        record_property(t.name, t.summary())


def test_top2_routing_ddtree_parts_from_plain_decoding_no_more_than_dflash(fleet, plain_model, moe_prompts,
                                                                           plain_answers, control_tally,
                                                                           record_property):
    tree = tally(fleet, TREE, plain_model, moe_prompts, plain_answers)
    verdict = compare(tree, control_tally)
    record(record_property, tree, control_tally)
    record_property("verdict", verdict.reason())
    assert tree.tokens >= 0.9 * control_tally.tokens, "the tree's answers were cut short by the parting limit"
    assert verdict.no_worse, verdict.reason()


def test_top2_routing_the_sibling_fault_fails_the_same_rule(fleet, plain_model, moe_prompts, plain_answers,
                                                            control_tally, record_property):
    fault = tally(fleet, FAULT, plain_model, moe_prompts, plain_answers)
    verdict = compare(fault, control_tally)
    record(record_property, fault, control_tally)
    record_property("verdict", verdict.reason())
    assert not verdict.no_worse, ("the rule passed a tree whose nodes see their siblings: on this pair it cannot tell "
                                  f"that fault from rounding ({verdict.reason()})")
