"""Kimi K2.6's own paths through DDTREE inside the real SGLang 0.5.23 server (issue 31; marker sglang_gpu).

Runs on the Kimi-shaped pair (tests/gpu_sglang/run.sh with SIZE=kimi: MLA at Kimi's latent widths, MoE with a
shared expert and noaux_tc routing, YaRN; exported as DeepseekV3ForCausalLM in target/, as the KimiK25 wrapper
in target-wrapper/, with INT4 routed experts in target-int4/); skipped on a pair without MLA. Each test
compares with plain decoding as test_ddtree_server does (identical, or where they part a bf16 near tie, the
float32 model's own choice or a near tie of the float32 model: tests/gpu_sglang/referee.py; then re-anchored):
- the radix cache (Python tree core, SGLang's strict idle pool check): shared system prompts, a multi-turn
  chat that extends a cached answer, a prompt equal to an earlier prompt + its answer - the tokens of the
  no-cache server, prefix hits seen, and after the load SGLang's own count of used KV slots back at its
  idle value (and, after a flush, every slot free), no leak reported, the server alive;
- the KimiK25 wrapper (its text-only processor stand-in): DDTREE equal to plain decoding and the wrapper's
  accept length equal to its language model's (the wrapper forwards the draft's hidden-state capture);
- INT4 routed experts (compressed-tensors W4A16, group 32) under SGLang's default MoE runner (Marlin) and
  its Triton one: DDTREE equal to plain decoding on the same checkpoint (partings judged by that checkpoint's
  model in float32);
- FlashInfer attention on the MLA target: refused at start-up (its verify graphs failed on this pair);
- SGLang's deterministic inference: DDTREE held to the strict rule where SGLang's own DFLASH meets it, and a
  seeded request's answer the same whatever the batch (issue 33).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.gpu_sglang.referee import int4_served_target, target_referee
from tests.gpu_sglang.test_ddtree_server import exact, none_greedy, reference  # noqa: F401  (fixtures)
from tests.gpu_sglang.test_ddtree_server import compare_with_plain, mean_accept, outputs, ready
from tests.helpers import import_bench

harness = import_bench("sglang_servers")


def _is_mla_pair() -> bool:
    path = Path(os.environ.get("SGLANG_DDTREE_PAIR", "/nonexistent")) / "target" / "config.json"
    return path.exists() and "kv_lora_rank" in path.read_text()


pytestmark = [pytest.mark.sglang_gpu,
              pytest.mark.skipif(not _is_mla_pair(), reason="needs the Kimi-shaped pair (run.sh with SIZE=kimi)")]

LEAK_MARKS = ("memory leak detected", "KV double free", "use-after-free")
SAMPLED = {"temperature": 0.7, "top_p": 0.9, "ignore_eos": True}
# the Kimi paths' servers (tests/gpu_sglang/run.sh starts them together with the others)
RADIX = ("none-radix", "ddtree-b32-c8-graphs-radix")
WRAPPER = ("none-wrapper", "ddtree-b32-c8-graphs-wrapper")
INT4_RUNNERS = {"marlin": "", "triton": "-moetriton"}
# SGLang's deterministic inference: fixed MoE tile configs and attention split sizes whatever the batch
# (NONE's takes custom logit processors too: the reference of the per-node processor test)
# DDTREE's serves per-node penalties, output logprobs and custom logit processors (SGLANG_DDTREE_PENALTIES=1,
# SGLANG_DDTREE_LOGPROBS=1, SGLANG_DDTREE_PROCESSORS=1): one server for the plain, penalty, logprob and processor
# tests (a request without those fields takes the plain path), one start instead of three
# -tok: SGLang 0.5.23 refuses min_new_tokens on a server that skips its tokenizer (the H200 run of 2026-12-03)
DETERMINISTIC = ("none-det-clp-tok", "dflash-det-tok", "ddtree-b32-c8-graphs-det-pen-lp-clp-tok")
PENALISED = LOGPROBS = DETERMINISTIC[2]
KIMI_SERVERS = (*RADIX, *WRAPPER, *(f"{a}-int4{r}" for r in INT4_RUNNERS.values()
                                   for a in ("none", "ddtree-b32-c8-graphs")), *DETERMINISTIC)


def compare_modes(plain, tree, prompts, want, record_property, exact, label=""):
    """The tree server one request at a time and 8 at once against plain decoding's `want` (partings judged
    by referee.judge: a bf16 near tie, the float32 model's own choice or a float32 near tie)."""
    one = tree.complete_all(prompts, harness.greedy(), 1)
    eight = tree.complete_all(prompts, harness.greedy(), 8)
    identical, ties, wrong = 0, [], []
    for mode, got in (("one by one", outputs(one)), ("8 at once", outputs(eight))):
        same, gaps, differences = compare_with_plain(plain, prompts, want, got, exact)
        identical += same
        ties += gaps
        wrong += [(mode, i, d) for i, d in differences]
    record_property(f"{label}identical to plain", f"{identical}/{2 * len(prompts)}")
    record_property(f"{label}near ties re-anchored", ties)
    record_property(f"{label}real differences", wrong)
    record_property(f"{label}accept length", round(mean_accept(one), 3))
    return wrong, one


# --- the radix cache ----------------------------------------------------------------------------

def loads(server) -> dict:
    with urllib.request.urlopen(f"{server.url}/v1/loads?include=core", timeout=30) as r:
        return json.loads(r.read())["loads"][0]


def settle_used_tokens(server, want: int, timeout: float = 20.0) -> int:
    """SGLang's used KV slot count (capacity - free - evictable), polled until it is `want` or time runs out."""
    deadline = time.monotonic() + timeout
    used = loads(server)["num_used_tokens"]
    while used != want and time.monotonic() < deadline:
        time.sleep(0.5)
        used = loads(server)["num_used_tokens"]
    return used


def radix_prompts(prompts: list[list[int]], answers: list[list[int]]) -> dict[str, list[list[int]]]:
    """Prompts the radix cache serves from a prefix (byte tokens; prompts start with <bos>):
    a 48-token system prompt shared by 4 user prompts; a second user turn after each of 4 answers
    (prompt + its cached answer + the next question); 4 prompts equal to an earlier prompt + its answer."""
    system = prompts[15][:49]
    return {"shared system prompt": [system + p[1:] for p in prompts[:4]],
            "multi-turn": [p + a + prompts[8 + i][1:33] for i, (p, a) in enumerate(zip(prompts[4:8], answers[4:8]))],
            "prompt + its answer": [p + a for p, a in zip(prompts[:4], answers[:4])]}


@pytest.mark.parametrize("name", RADIX)
def test_radix_cache_gives_the_no_cache_tokens_and_frees_its_pool(fleet, name, prompts, none_greedy, exact,
                                                                   record_property):
    server, plain = ready(fleet, name), ready(fleet, "none")
    idle_used = loads(server)["num_used_tokens"]
    record_property("idle used KV slots", idle_used)
    # the turns the radix prompts extend, through this server: its cache now holds them
    outputs(server.complete_all(prompts[:8], harness.greedy(), 1))
    groups = radix_prompts(prompts, none_greedy)          # plain decoding's answers (no cache) are the turns
    wrong, hits = [], {}
    for label, group in groups.items():
        want = outputs(plain.complete_all(group, harness.greedy(), 1))
        for mode, concurrency in (("one by one", 1), ("8 at once", 8)):
            answers = server.complete_all(group, harness.greedy(), concurrency)
            same, gaps, differences = compare_with_plain(plain, group, want, outputs(answers), exact)
            wrong += [(label, mode, i, d) for i, d in differences]
            hits.setdefault(label, []).extend(a["meta_info"].get("cached_tokens", 0) for a in answers)
            record_property(f"{label} ({mode}) identical / near ties", f"{same}/{len(group)} / {gaps}")
    record_property("prefix hits (cached tokens per request)", {k: [min(v), max(v)] for k, v in hits.items()})
    record_property("real differences", wrong)
    used_after = settle_used_tokens(server, idle_used)
    record_property("used KV slots after the load", used_after)
    flushed = urllib.request.urlopen(f"{server.url}/flush_cache", timeout=30).status
    used_flushed = settle_used_tokens(server, 0)
    record_property("used KV slots after /flush_cache", used_flushed)
    log = server.log_text()
    leaks = [mark for mark in LEAK_MARKS if mark in log]
    record_property("leak reports", leaks)
    assert not wrong
    assert all(min(v) > 0 for v in hits.values()), f"a prompt group had no prefix hit: {hits}"
    assert used_after == idle_used, f"{used_after - idle_used} KV slots still held after the load"
    assert flushed == 200 and used_flushed == 0
    assert not leaks and server.proc.poll() is None, f"{name}: {leaks or server.exit_message()}"


# --- the KimiK25 wrapper --------------------------------------------------------------------------

def test_kimi_wrapper_decodes_ddtree_as_its_language_model(fleet, prompts, none_greedy, exact, record_property):
    plain_wrapper, tree_wrapper = ready(fleet, WRAPPER[0]), ready(fleet, WRAPPER[1])
    assert "KimiK25ForConditionalGeneration" in (Path(os.environ["SGLANG_DDTREE_PAIR"]) / "target-wrapper"
                                                 / "config.json").read_text()
    same_plain = sum(a == b for a, b in zip(outputs(plain_wrapper.complete_all(prompts, harness.greedy(), 8)),
                                            none_greedy))
    record_property("plain wrapper = plain DeepseekV3 (same weights)", f"{same_plain}/{len(prompts)}")
    wrong, one = compare_modes(fleet.get("none"), tree_wrapper, prompts, none_greedy, record_property, exact)
    inner = ready(fleet, "ddtree-b32-c8-graphs").complete_all(prompts, harness.greedy(), 1)
    record_property("accept length wrapper / language model", f"{mean_accept(one):.3f} / {mean_accept(inner):.3f}")
    assert not wrong
    # the draft reads six target layers through the wrapper: a capture that was not forwarded would
    # leave the draft blind (accept length near 1), a partial one would lower it
    assert abs(mean_accept(one) - mean_accept(inner)) <= 0.02 * mean_accept(inner)


# --- INT4 routed experts ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def int4_exact():
    """The float32 referee of the INT4 checkpoint (referee.py): the trained target as the export read it, each
    routed expert's weight replaced by what the INT4 export serves, every other weight rounded to bf16."""
    target = int4_served_target(Path(os.environ["SGLANG_DDTREE_REF"]), "cuda")
    return target_referee(target, "cuda")


@pytest.mark.parametrize("runner", list(INT4_RUNNERS))
def test_int4_experts_ddtree_equals_plain_decoding(fleet, runner, prompts, none_greedy, int4_exact,
                                                   record_property):
    suffix = INT4_RUNNERS[runner]
    plain, tree = fleet.get(f"none-int4{suffix}"), fleet.get(f"ddtree-b32-c8-graphs-int4{suffix}")
    for s in (plain, tree):
        if s.ready_after is None:
            tail = [ln for ln in s.log_text().splitlines()[-40:] if ln.strip()]
            record_property(f"{s.config.name} did not start", tail[-12:])
            pytest.fail(f"{s.config.name} did not become healthy (MoE runner {runner}): "
                        f"exit {s.proc.returncode}; {s.exit_message()}")
    log = plain.log_text()
    record_property("MoE scheme", next((ln.split("Using ")[-1] for ln in log.splitlines()
                                        if "Using CompressedTensorsWNA16" in ln), "not logged"))
    want = outputs(plain.complete_all(prompts, harness.greedy(), 1))
    same_bf16 = sum(a == b for a, b in zip(want, none_greedy))
    record_property("INT4 plain = bf16 plain (tokens)", f"{same_bf16}/{len(prompts)}")
    wrong, one = compare_modes(plain, tree, prompts, want, record_property, int4_exact)
    assert not wrong
    assert mean_accept(one) > 1.5


# --- FlashInfer on MLA: refused ------------------------------------------------------------------

def test_flashinfer_on_the_mla_target_is_refused_at_start_up(pair, tmp_path, record_property):
    """FlashInfer's verify-graph capture failed on this pair (H200 2026-12-02: "FlashInfer Internal Error:
    Invalid configuration" in BatchPrefillWithPagedKVCacheDispatched); the plugin refuses it for MLA targets."""
    server = harness.Server(harness.config("ddtree-b32-c8-graphs-flashinfer"), 31990, tmp_path / "flashinfer.log")
    server.start(pair)
    try:
        server.proc.wait(timeout=300)
    finally:
        server.stop()
    record_property("exit", server.exit_message()[-300:])
    assert server.proc.returncode != 0
    assert "--attention-backend=flashinfer is not proven for DDTREE on a multi-head latent attention target" \
        in server.log_text()


# --- SGLang's deterministic inference -------------------------------------------------------------------

@pytest.fixture(scope="session")
def det_greedy(fleet, prompts) -> list[list[int]]:
    """NONE's greedy answers one at a time under deterministic inference."""
    return outputs(ready(fleet, DETERMINISTIC[0]).complete_all(prompts, harness.greedy(), 1))


def test_deterministic_inference_takes_the_bf16_drift_out(fleet, prompts, det_greedy, record_property):
    """With --enable-deterministic-inference SGLang fixes its MoE tile configuration and attention split size
    whatever the batch. If that makes its own DFLASH give NONE's tokens on this MoE target, DDTREE is held to
    the strict rule there: identical, or a near tie of at most two bf16 steps (no float32 referee)."""
    plain, dflash, tree = (ready(fleet, n) for n in DETERMINISTIC)
    want = det_greedy
    results = {}
    for label, server, concurrency in (("DFLASH", dflash, 1), ("DDTREE one by one", tree, 1),
                                       ("DDTREE 8 at once", tree, 8)):
        got = outputs(server.complete_all(prompts, harness.greedy(), concurrency))
        same, gaps, wrong = compare_with_plain(plain, prompts, want, got)
        results[label] = wrong
        record_property(f"{label}: identical / near ties / real differences", f"{same}/{len(prompts)} / {gaps} / {wrong}")
    if results["DFLASH"]:
        pytest.skip(f"SGLang's own DFLASH parts from NONE past a near tie even with deterministic inference: "
                    f"{results['DFLASH'][:2]} - the strict rule does not apply to this target")
    assert not results["DDTREE one by one"] and not results["DDTREE 8 at once"]


# --- seeded sampling (issue 33, item 3) ------------------------------------------------------------------

def seeded(seed: int) -> dict:
    return {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 64, "ignore_eos": True, "sampling_seed": seed}


def test_a_seeded_request_repeats_its_answer_whatever_the_batch(fleet, prompts, record_property):
    """Under deterministic inference the same (prompt, seed) gives the same answer one at a time, 8 at once,
    and among unseeded requests; NONE's seeded answers from the same server kind are recorded beside it
    (equal up to bf16 drift: each node is drawn as NONE draws at that position). Without deterministic
    inference a seed is refused, naming the flag."""
    plain, tree = ready(fleet, DETERMINISTIC[0]), ready(fleet, DETERMINISTIC[2])
    eight = prompts[:8]

    def answers(server, concurrency, crowd=0):
        with ThreadPoolExecutor(max_workers=concurrency + crowd) as pool:
            noise = [pool.submit(server.generate, p, {**SAMPLED, "max_new_tokens": 64}) for p in prompts[8:8 + crowd]]
            mine = list(pool.map(lambda i: server.generate(eight[i], seeded(i)), range(len(eight))))
            [f.result() for f in noise]
        return outputs(mine)

    alone, together, crowded = answers(tree, 1), answers(tree, 8), answers(tree, 4, crowd=8)
    none_answers = answers(plain, 1)
    record_property("same answer: 8 at once / among 8 unseeded", f"{sum(a == b for a, b in zip(alone, together))}/8, "
                    f"{sum(a == b for a, b in zip(alone, crowded))}/8")
    record_property("DDTREE seeded = NONE seeded (bf16 drift aside)", f"{sum(a == b for a, b in zip(alone, none_answers))}/8")
    refused = ready(fleet, "ddtree-b32-c8-graphs").generate(eight[0], seeded(0))
    record_property("without deterministic inference", str(refused.get("http_status")))
    other_seed = outputs([tree.generate(eight[0], seeded(100))])[0]
    assert alone == together == crowded
    assert other_seed != alone[0], "another seed gave the same 64 sampled tokens: the seed is not used"
    assert refused.get("http_status") == 400 and "--enable-deterministic-inference" in refused["error"]



# --- penalties per node (issue 33, item 2) ----------------------------------------------------------------

PENALTIES = {"frequency": {"frequency_penalty": 0.6}, "presence": {"presence_penalty": 0.8},
             "repetition": {"repetition_penalty": 1.3}, "min_new_tokens": {"min_new_tokens": 100, "ignore_eos": False},
             "all": {"frequency_penalty": 0.3, "presence_penalty": 0.3, "repetition_penalty": 1.1}}


@pytest.fixture(scope="session")
def dflash_is_exact(fleet, prompts, det_greedy) -> bool:
    """Whether SGLang's own DFLASH under deterministic inference gives NONE's greedy tokens on every prompt:
    the condition for holding DDTREE to exact identity there."""
    return det_greedy == outputs(ready(fleet, DETERMINISTIC[1]).complete_all(prompts, harness.greedy(), 1))


@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_penalties_per_node_give_nones_tokens(fleet, prompts, penalty, dflash_is_exact, record_property):
    """Under deterministic inference, where SGLang's own DFLASH gives NONE's greedy tokens exactly, a penalised
    greedy request on DDTREE gives NONE's penalised tokens exactly, one at a time and 8 at once (no
    re-anchoring: plain decoding's top-2 would not carry the penalty); and the penalty changed NONE's answer."""
    plain, tree = ready(fleet, DETERMINISTIC[0]), ready(fleet, PENALISED)
    sampling = {**harness.greedy(), **PENALTIES[penalty]}
    want = outputs(plain.complete_all(prompts, sampling, 1))
    unpenalised = outputs(plain.complete_all(prompts, harness.greedy(), 1))
    same = {}
    for mode, concurrency in (("one by one", 1), ("8 at once", 8)):
        got = outputs(tree.complete_all(prompts, sampling, concurrency))
        same[mode] = sum(a == b for a, b in zip(want, got))
        firsts = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(want, got)]
        record_property(f"{mode}: identical / first differences", f"{same[mode]}/{len(prompts)} / {firsts}")
    changed = sum(a != b for a, b in zip(want, unpenalised))
    record_property("prompts whose NONE answer the penalty changed", f"{changed}/{len(prompts)}")
    assert changed > 0
    if not dflash_is_exact:
        pytest.skip("SGLang's own DFLASH is not exact against NONE under deterministic inference on this target: "
                    f"identity is not the bar (identical {same})")
    assert same == {"one by one": len(prompts), "8 at once": len(prompts)}



# --- custom logit processors (issue 33, item 5) -----------------------------------------------------------

def ngram_blocker() -> str:
    from sglang.srt.sampling.custom_logit_processor import DeepseekOCRNoRepeatNGramLogitProcessor

    return DeepseekOCRNoRepeatNGramLogitProcessor.to_str()


def test_custom_logit_processor_per_node_gives_nones_tokens(fleet, prompts, dflash_is_exact, record_property):
    """SGLang's own DeepSeek-OCR n-gram blocker (it reads the answer so far through the request) under
    deterministic inference: DDTREE's greedy answers equal NONE's exactly, one at a time and 8 at once, and the
    processor changed NONE's answer."""
    plain, tree = ready(fleet, DETERMINISTIC[0]), ready(fleet, PENALISED)
    sampling = {**harness.greedy(), "custom_params": {"ngram_size": 3, "window_size": 96}}

    def run(server, concurrency):
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return outputs(list(pool.map(lambda p: server.generate(p, sampling, custom_logit_processor=ngram_blocker()),
                                         prompts)))

    want = run(plain, 1)
    changed = sum(a != b for a, b in zip(want, outputs(plain.complete_all(prompts, harness.greedy(), 1))))
    record_property("prompts whose NONE answer the processor changed", f"{changed}/{len(prompts)}")
    same = {}
    for mode, concurrency in (("one by one", 1), ("8 at once", 8)):
        got = run(tree, concurrency)
        same[mode] = sum(a == b for a, b in zip(want, got))
        record_property(f"{mode}: identical", f"{same[mode]}/{len(prompts)}")
    assert changed > 0
    if not dflash_is_exact:
        pytest.skip(f"SGLang's own DFLASH is not exact against NONE under deterministic inference here (identical {same})")
    assert same == {"one by one": len(prompts), "8 at once": len(prompts)}


# --- output logprobs (issue 33, item 1) --------------------------------------------------------------------

LOGPROB_TOLERANCE = 0.1    # nats: bf16 logits over a verify pass against a decode step (see the export check)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_output_logprobs_equal_nones(fleet, prompts, concurrency, record_property):
    """Greedy with return_logprob and 5 top logprobs: on every token where DDTREE's answer equals NONE's (both
    with deterministic inference), its logprob and top-5 are as close to NONE's as SGLang's own DFLASH's are (the
    control, same numerics: a verify pass's logits against a decode step's; at most twice its largest difference
    + 0.02, and within LOGPROB_TOLERANCE); every emitted token has one. (The H200 run of 2026-12-03 saw DDTREE at
    max 0.25 / top-5 0.78 on the top-2-of-8 pair with no control beside it.)"""
    plain, tree, control = ready(fleet, DETERMINISTIC[0]), ready(fleet, LOGPROBS), ready(fleet, DETERMINISTIC[1])
    asks = {"return_logprob": True, "top_logprobs_num": 5}

    def run(server, conc):
        with ThreadPoolExecutor(max_workers=conc) as pool:
            return list(pool.map(lambda p: server.generate(p, harness.greedy(64), **asks), prompts))

    want = run(plain, 1)

    def against_none(got) -> tuple[list[float], list[float], int]:
        diffs, top_diffs, compared = [], [], 0
        for w, g in zip(want, got):
            wl, gl = w["meta_info"]["output_token_logprobs"], g["meta_info"]["output_token_logprobs"]
            assert len(gl) == len(g["output_ids"]), "a committed token without its logprob"
            same = next((i for i, (a, b) in enumerate(zip(w["output_ids"], g["output_ids"])) if a != b),
                        len(g["output_ids"]))
            compared += same
            diffs += [abs(a[0] - b[0]) for a, b in zip(wl[:same], gl[:same])]
            tops = zip(w["meta_info"]["output_top_logprobs"][:same], g["meta_info"]["output_top_logprobs"][:same])
            for a, b in tops:
                top_diffs += [abs(x[0] - y[0]) for x, y in zip(a, b) if x[1] == y[1]]
        return diffs, top_diffs, compared

    diffs, top_diffs, compared = against_none(run(tree, concurrency))
    control_diffs, control_top, _ = against_none(run(control, 1))
    bound = min(LOGPROB_TOLERANCE, 2 * max(control_diffs + control_top, default=0.0) + 0.02)
    record_property("tokens compared", compared)
    record_property("|dlogprob| mean / max", f"{sum(diffs) / len(diffs):.4f} / {max(diffs):.4f}")
    record_property("top-5 |dlogprob| max (same ids)", f"{max(top_diffs):.4f}")
    record_property("DFLASH (control) |dlogprob| max / top-5 max",
                    f"{max(control_diffs, default=0):.4f} / {max(control_top, default=0):.4f}")
    assert compared > len(prompts) * 16
    assert max(diffs) <= bound and max(top_diffs) <= bound, bound
