"""DDTREE under SGLang 0.5.23's overlap scheduler (issue 35; marker sglang_gpu).

Servers (testbed/servers.py): -overlap runs SGLang's overlap scheduler (served without a switch since
these tests passed on the decidable pairs, issue 45), -synccheck runs each DDTREE step under torch's CUDA sync
debug mode (warn), -bs48 takes 48 running requests with decode graphs up to 48. What is checked, each able to fail:
- temperature 0: DDTREE with overlap emits NONE's tokens (partings only at bf16 near ties, as in
  test_ddtree_server), one request at a time, 8 at once, and 48 at once with requests arriving at staggered
  times and finishing at different lengths - the overlap scheduler's hard case: a request that finishes at
  step n while step n + 1 is already prepared;
- temperature 0.7: the 4th token's distribution matches NONE's (two-sample chi-square), its control rejected;
- no host synchronisation inside the step from this project's code (the sync check's log lines name every
  call site; SGLang's own sites are recorded, not judged);
- penalties, min_new_tokens and custom logit processors (which read the answer so far on the host, a step late
  under the overlap loop) get HTTP 400 naming the field, and the server serves on;
- SGLang's deprecation warning for plugin workers without overlap support is gone from the log.
"""

from __future__ import annotations

import random
import re
import threading
import time

import pytest

from tests.gpu_sglang.test_ddtree_server import (SAMPLES, SAMPLING, compare_with_plain, entropy, fourth_tokens,
                                                 mean_accept, outputs, ready)
from tests.gpu_sglang.test_ddtree_server import exact, none_greedy, reference  # noqa: F401  (fixtures)
from tests.helpers import two_sample_chi_square_pvalue

from testbed import servers as harness
pytestmark = pytest.mark.sglang_gpu

OVERLAP = "ddtree-b32-c8-graphs-overlap"
OVERLAP_48 = "ddtree-b32-c8-graphs-overlap-synccheck-bs48"
NONE_48 = "none-bs48"
OVERLAP_SERVERS = (OVERLAP, OVERLAP_48, NONE_48)
DEPRECATED = "supports_overlap=False, which is deprecated"
SYNC_MARK = "DDTREE sync check: a synchronizing CUDA operation at"


@pytest.mark.parametrize("concurrency", [1, 8])
def test_overlap_greedy_equals_none(fleet, prompts, none_greedy, exact, concurrency, record_property):
    plain, tree = ready(fleet, "none"), ready(fleet, OVERLAP)
    answers = tree.complete_all(prompts, harness.greedy(), concurrency)
    same, ties, wrong = compare_with_plain(plain, prompts, none_greedy, outputs(answers), exact)
    record_property("identical to NONE", f"{same}/{len(prompts)}")
    record_property("near ties re-anchored", ties)
    record_property("accept length", round(mean_accept(answers), 3))
    assert not wrong, wrong
    assert mean_accept(answers) > 1.5


def staggered(server: harness.Server, asks: list[tuple[list[int], int]], seed: int = 0) -> list[dict]:
    """Every (prompt, max_new_tokens) sent from its own thread after a random delay of 0..2 s, so requests join
    and leave the running batch while others decode."""
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 2.0) for _ in asks]
    results: list[dict | None] = [None] * len(asks)

    def send(i: int) -> None:
        time.sleep(delays[i])
        prompt, n = asks[i]
        results[i] = server.generate(prompt, harness.greedy(n))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_overlap_48_at_once_with_requests_arriving_and_finishing(fleet, prompts, exact, record_property):
    plain, tree = ready(fleet, NONE_48), ready(fleet, OVERLAP_48)
    rng = random.Random(1)
    asks = [(prompts[i % len(prompts)], rng.choice([9, 17, 33, 64, 100, 128])) for i in range(48)]
    want = outputs(plain.complete_all([p for p, _ in asks], harness.greedy(128), 8))
    want = [w[:n] for w, (_, n) in zip(want, asks)]                  # greedy: a shorter answer is a prefix
    got = outputs(staggered(tree, asks))
    assert [len(g) for g in got] == [n for _, n in asks]
    same, ties, wrong = compare_with_plain(plain, [p for p, _ in asks], want, got, exact)
    record_property("identical to NONE", f"{same}/{len(asks)}")
    record_property("near ties re-anchored", ties)
    assert not wrong, wrong


def test_overlap_sampling_distribution_matches_none(fleet, prompts, record_property):
    none, tree = ready(fleet, "none"), ready(fleet, OVERLAP)
    prompt = max(prompts[:8], key=lambda p: entropy(fourth_tokens(none, p, SAMPLING, 200)))
    plain = fourth_tokens(none, prompt, SAMPLING, SAMPLES)
    spec = fourth_tokens(tree, prompt, SAMPLING, SAMPLES)
    hot = fourth_tokens(tree, prompt, {**SAMPLING, "temperature": 1.0}, SAMPLES)
    p_same, p_control = two_sample_chi_square_pvalue(plain, spec), two_sample_chi_square_pvalue(plain, hot)
    record_property("p (overlap DDTREE 0.7 vs NONE 0.7)", f"{p_same:.3g}")
    record_property("p control (1.0 vs 0.7)", f"{p_control:.3g}")
    assert p_same > 1e-3 and p_control < 1e-3


# requests that read the answer so far on the host: refused under the overlap scheduler (ddtree.sglang.requests)
REFUSED_UNDER_OVERLAP = (("frequency_penalty", {"frequency_penalty": 0.5}, {}),
                         ("min_new_tokens", {"min_new_tokens": 4}, {}),
                         ("custom_logit_processor", {}, {"custom_logit_processor": '{"callable": "x"}'}))


@pytest.mark.parametrize("field,params,extra", REFUSED_UNDER_OVERLAP, ids=[r[0] for r in REFUSED_UNDER_OVERLAP])
def test_requests_that_read_the_answer_are_refused_under_overlap_and_the_server_serves_on(
        fleet, prompts, field, params, extra, record_property):
    """Each gets HTTP 400 naming the field and the fix from the overlap server, which then answers a plain
    request as before: the refusal comes from the plugin's request hook, before SGLang's own checks."""
    server = ready(fleet, OVERLAP)
    refused = server.generate(prompts[0], {**harness.greedy(8), **params}, **extra)
    record_property("answer", {k: str(v)[:200] for k, v in refused.items() if k in ("http_status", "error")})
    assert refused.get("http_status") == 400, refused
    assert field in refused["error"] and "--disable-overlap-schedule" in refused["error"], refused["error"][:400]
    plain = server.generate(prompts[0], harness.greedy(8))
    assert len(plain.get("output_ids", [])) == 8, plain


def test_no_host_sync_in_the_step_and_no_deprecation_warning(fleet, record_property):
    """After the tests above (file order): the sync-checked server's log names no call site of this project;
    neither overlap server logs SGLang's deprecation of plugin workers without overlap support."""
    checked = ready(fleet, OVERLAP_48)
    sites = sorted(set(re.findall(re.escape(SYNC_MARK) + r" (\S+)", checked.log_text())))
    ours = [s for s in sites if "/ddtree/" in s]
    record_property("sync sites (SGLang's)", [s for s in sites if s not in ours][:20])
    record_property("sync sites (this project's)", ours)
    assert not ours, ours
    for name in (OVERLAP, OVERLAP_48):
        assert DEPRECATED not in ready(fleet, name).log_text(), name
