"""Request features on DDTREE inside the real SGLang 0.5.23 server, on any pair (issues 33 and 45; marker
sglang_gpu): SGLang's deterministic inference as the control that decides identity, seeded sampling, penalties
and min_new_tokens at every tree node, custom logit processors per node, output logprobs.

Where identity is decidable - SGLang's own DFLASH under deterministic inference gives NONE's greedy tokens on every
prompt, which the dense pair and the Kimi-shaped pair without routing choices (kimi-dense) are expected to show -
DDTREE is held to exact identity with NONE's answers under each feature, one at a time and 8 at once; otherwise
the test records what it saw and skips, naming the control that failed. The controls run in the same job, on
servers of the same kind (testbed/decide.sh requests starts them beside the DDTREE servers).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from testbed.referee import best_gap, judge, processed_referee
from tests.gpu_sglang.test_ddtree_server import compare_with_plain, outputs, ready
from tests.gpu_sglang.test_ddtree_server import reference  # noqa: F401  (fixture: the float32 referee's target)

from testbed import servers as harness
pytestmark = pytest.mark.sglang_gpu

SAMPLED = {"temperature": 0.7, "top_p": 0.9, "ignore_eos": True}
# SGLang's deterministic inference: fixed MoE tile configs and attention split sizes whatever the batch
# (NONE's takes custom logit processors too: the reference of the per-node processor test)
# DDTREE's serves per-node penalties and output logprobs (every DDTREE server without the overlap scheduler) and
# custom logit processors (--enable-custom-logit-processor): one server for the plain, penalty, logprob and processor
# tests (a request without those fields takes the plain path), one start instead of three
# -tok: SGLang 0.5.23 refuses min_new_tokens on a server that skips its tokenizer (the H200 run of 2026-12-03)
DETERMINISTIC = ("none-det-clp-tok", "dflash-det-clp-tok", "ddtree-b32-c8-graphs-det-clp-tok")
PENALISED = LOGPROBS = DETERMINISTIC[2]
# the servers this module's tests ask for
# the deliberate fault: DDTREE with every node penalised by the step start's counts (SGLANG_DDTREE_FAULT=stale-penalties)
STALE_PENALTIES = "ddtree-b32-c8-graphs-det-tok-stalepen"
# the features a DDTREE server serves under the overlap scheduler that read nothing of the answer on the host (seeds
# and output logprobs, computed on the device): the same tests against the same NONE, on DDTREE under it
# (-k overlap selects them; penalties, min_new_tokens and processors are refused there, test_overlap.py)
OVERLAP_DET = "ddtree-b32-c8-graphs-det-overlap-tok"
TREES = {"plain": DETERMINISTIC[2], "overlap": OVERLAP_DET}
REQUEST_SERVERS = (*DETERMINISTIC, "ddtree-b32-c8-graphs", STALE_PENALTIES, OVERLAP_DET)


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


@pytest.mark.parametrize("scheduler", sorted(TREES))
def test_a_seeded_request_repeats_its_answer_whatever_the_batch(fleet, prompts, scheduler, record_property):
    """Under deterministic inference the same (prompt, seed) gives the same answer one at a time, 8 at once,
    and among unseeded requests; NONE's seeded answers from the same server kind are recorded beside it
    (equal up to bf16 drift: each node is drawn as NONE draws at that position). Without deterministic
    inference a seed is refused, naming the flag."""
    plain, tree = ready(fleet, DETERMINISTIC[0]), ready(fleet, TREES[scheduler])
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



# --- judging a processed request against NONE's -------------------------------------------------------------

@dataclass
class Judged:
    """Answers of a server against NONE's under the same request fields: how many identical, the partings at a
    near tie of NONE's own processed top-2 (how far the token taken lies below NONE's best), the real differences
    (prompt, position, token taken, how far below)."""
    identical: int
    ties: list[float]
    wrong: list[tuple]                # (prompt, position, token taken, how far below[, the float32 referee's reason])
    refereed: list = field(default_factory=list)   # partings past a bf16 near tie the float32 referee passed


def judge_processed(plain: harness.Server, prompts: list[list[int]], sampling: dict, want: list[list[int]],
                    got: list[list[int]], referee=None, **asks) -> Judged:
    """Where an answer parts from NONE's, NONE's own log-probs at that position under the same request - after
    its penalties, logit bias and custom logit processor, which SGLang 0.5.23 applies before its logprobs - say
    whether the token taken is within a near tie of NONE's best (referee.py's NEAR_TIE: bf16 verify against decode
    rounding) or a real difference. A penalty or processor applied with the wrong counts moves a logit by the
    penalty itself (0.3-0.8 nats here, -inf for a blocked n-gram or held stop token). referee: the reference
    target in float32 (a session fixture); past a bf16 near tie, a parting still passes where the float32 model
    with the request's penalties (referee.processed_referee) takes the token taken or puts it within a near tie of
    its best (the same rule as the greedy tests' referee); such partings are counted as ties and listed in
    `refereed`."""
    identical, ties, wrong, refereed = 0, [], [], []
    for i, (w, g) in enumerate(zip(want, got)):
        at = harness.first_divergence(w, g)
        if at is None:
            identical += 1
            continue
        # SGLang refuses max_new_tokens below min_new_tokens: ask for at least that many
        length = max(at + 1, int(sampling.get("min_new_tokens", 0)))
        r = plain.generate(prompts[i], {**sampling, "max_new_tokens": length}, return_logprob=True, top_logprobs_num=5,
                           **asks)
        assert "meta_info" in r, f"NONE refused the referee's request: {r}"
        tops = r["meta_info"]["output_top_logprobs"]
        taken = g[at] if at < len(g) else None
        if at >= len(tops):                  # NONE stopped before this position and the answer went on
            wrong.append((i, at, taken, float("inf")))
            continue
        top = harness.top_dict(tops[at])
        if taken is None:                    # the answer stopped here and NONE's went on
            wrong.append((i, at, None, round(best_gap(top), 4)))
            continue
        f32 = None if referee is None else processed_referee(referee, "cuda", len(prompts[i]), sampling)
        parting = judge(at, w[at], taken, top, None if f32 is None else lambda: f32.logprobs(prompts[i] + g[:at]))
        if not parting.passed:
            wrong.append((i, at, taken, round(parting.bf16_gap, 4)) + (() if f32 is None else (parting.reason(),)))
            continue
        ties.append(round(parting.bf16_gap, 5))
        if parting.kind != "near tie":
            refereed.append(parting.record())
    return Judged(identical, ties, wrong, refereed)


def record_judged(record_property, label: str, judged: Judged, n: int) -> None:
    record_property(f"{label}: identical / near ties / real differences",
                    f"{judged.identical}/{n} / {judged.ties} / {judged.wrong[:6]}")
    if judged.refereed:
        record_property(f"{label}: past a bf16 near tie, passed by the float32 referee", str(judged.refereed))


# --- penalties per node (issue 33, item 2; issue 45) ---------------------------------------------------------

SPACE = 32      # the byte tokenizer's space: a stop token min_new_tokens must hold back
# min_new_tokens: NONE stops at the first space without it (its base); with it the space is held back for 24 tokens
HOLD = {"ignore_eos": False, "stop_token_ids": [SPACE]}
PENALTIES = {"frequency": {"frequency_penalty": 0.6}, "presence": {"presence_penalty": 0.8},
             "repetition": {"repetition_penalty": 1.3},
             "min_new_tokens": {**HOLD, "min_new_tokens": 24},
             # combinations whose result does not depend on the order SGLang applies them in (see ORDER_DEPENDENT)
             "additive": {"frequency_penalty": 0.3, "presence_penalty": 0.3},
             "repetition_held": {**HOLD, "repetition_penalty": 1.1, "min_new_tokens": 24}}
PENALTY_BASE = {name: HOLD for name, sampling in PENALTIES.items() if "min_new_tokens" in sampling}
# Repetition (a scaling) combined with frequency or presence (additive): the result depends on the order, and SGLang
# 0.5.23's NONE leaves the order to chance. Its non-overlap, non-speculative path (what DETERMINISTIC[0] runs)
# applies the penalizers one by one in the iteration order of a Python set of classes
# (SamplingBatchInfo.from_schedule_batch -> BatchedPenalizerOrchestrator.apply without repeat), which the classes'
# addresses decide: five processes on one machine gave five orders (2026-12-04). Its speculative verify and its
# overlap path add first, then scale - DDTREE's fixed order. The orders part by |additive| x (1 - 1/repetition):
# 0.57 nats for a token seen 20 times at frequency 0.3 and repetition 1.1. The H200 runs of 2026-12-04: DDTREE parted
# from that NONE only here, 28-121 tokens in, mostly at the output's most frequent token (the space). (NONE under
# the overlap scheduler is no reference either: it feeds each output token a step late and the prompt's last token
# as an output - seen parting from the non-overlap NONE at 3-80 tokens on the same requests.)
ORDER_DEPENDENT = {"frequency_penalty": 0.3, "presence_penalty": 0.3, "repetition_penalty": 1.1}


@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_penalties_per_node_give_nones_tokens(fleet, prompts, penalty, reference, record_property):
    """Under deterministic inference, a penalised greedy request on DDTREE gives NONE's penalised tokens, one at a
    time and 8 at once, parted only at a near tie of NONE's own penalised top-2 or where the float32 model with the
    same penalties takes DDTREE's token or holds it within a near tie (judge_processed); the penalty
    changed NONE's answer. Beside it, recorded: SGLang's own DFLASH on the same requests (its verify applies the
    step start's penalty over the block)."""
    plain, tree, dflash = ready(fleet, DETERMINISTIC[0]), ready(fleet, PENALISED), ready(fleet, DETERMINISTIC[1])
    sampling = {**harness.greedy(), **PENALTIES[penalty]}
    want = outputs(plain.complete_all(prompts, sampling, 1))
    base = outputs(plain.complete_all(prompts, {**harness.greedy(), **PENALTY_BASE.get(penalty, {})}, 1))
    changed = sum(a != b for a, b in zip(want, base))
    record_property("prompts whose NONE answer the penalty changed", f"{changed}/{len(prompts)}")
    wrong = []
    for mode, concurrency in (("one by one", 1), ("8 at once", 8)):
        got = outputs(tree.complete_all(prompts, sampling, concurrency))
        judged = judge_processed(plain, prompts, sampling, want, got, referee=reference.target)
        record_judged(record_property, f"DDTREE {mode}", judged, len(prompts))
        wrong += judged.wrong
    control = judge_processed(plain, prompts, sampling, want, outputs(dflash.complete_all(prompts, sampling, 1)),
                              referee=reference.target)
    record_judged(record_property, "SGLang's DFLASH (recorded)", control, len(prompts))
    assert changed > 0
    assert not wrong, wrong[:5]


def test_penalties_whose_order_sglang_leaves_to_chance(fleet, prompts, record_property):
    """ORDER_DEPENDENT: no SGLang NONE decides these, so NONE's verdict is recorded, not asserted (the CPU contract
    test tests/sglang/test_penalties.py holds DDTREE to NONE with SGLang's speculative order, and shows the other
    order gives other tokens). Asserted: DDTREE's answers do not depend on the batch (one by one = 8 at once)."""
    plain, tree = ready(fleet, DETERMINISTIC[0]), ready(fleet, PENALISED)
    sampling = {**harness.greedy(), **ORDER_DEPENDENT}
    want = outputs(plain.complete_all(prompts, sampling, 1))
    alone, batched = (outputs(tree.complete_all(prompts, sampling, c)) for c in (1, 8))
    record_judged(record_property, "DDTREE against this start's NONE (recorded)",
                  judge_processed(plain, prompts, sampling, want, alone), len(prompts))
    differ = [i for i, (a, b) in enumerate(zip(alone, batched)) if a != b]
    record_property("DDTREE one by one against 8 at once: prompts that differ", str(differ))
    assert not differ


def test_step_start_penalties_fail_the_same_rule(fleet, prompts, reference, record_property):
    """The deliberate fault, judged by the same rule: DDTREE with each node penalised by the step start's counts
    instead of its own path's (SGLANG_DDTREE_FAULT=stale-penalties) must show real differences under each additive
    and scaling penalty - or the rule could not tell a right per-node penalty from a wrong one."""
    plain, faulty = ready(fleet, DETERMINISTIC[0]), ready(fleet, STALE_PENALTIES)
    caught = {}
    for penalty in ("frequency", "presence", "repetition"):
        sampling = {**harness.greedy(), **PENALTIES[penalty]}
        want = outputs(plain.complete_all(prompts, sampling, 1))
        judged = judge_processed(plain, prompts, sampling, want, outputs(faulty.complete_all(prompts, sampling, 1)),
                                 referee=reference.target)
        record_judged(record_property, f"fault, {penalty}", judged, len(prompts))
        caught[penalty] = len(judged.wrong)
    assert all(caught.values()), f"the fault passed the rule under {[k for k, v in caught.items() if not v]}"


# --- custom logit processors (issue 33, item 5; issue 45) ---------------------------------------------------

def ngram_blocker() -> str:
    from sglang.srt.sampling.custom_logit_processor import DeepseekOCRNoRepeatNGramLogitProcessor

    return DeepseekOCRNoRepeatNGramLogitProcessor.to_str()


def test_custom_logit_processor_per_node_gives_nones_tokens(fleet, prompts, record_property):
    """SGLang's own DeepSeek-OCR n-gram blocker (it reads the answer so far through the request: SGLang's Req, its
    token ids in array('q')) under deterministic inference: DDTREE's greedy answers are NONE's, parted only at a
    near tie of NONE's processed top-2 (a blocked token is at -inf there), one at a time and 8 at once; the
    processor changed NONE's answer. SGLang's own DFLASH beside it is recorded (it passes the step's Req at every
    block position). The server must stay up (on 2026-12-03 the blocker crashed DDTREE's scheduler: a list view
    of the Req's array)."""
    plain, tree, dflash = ready(fleet, DETERMINISTIC[0]), ready(fleet, PENALISED), ready(fleet, DETERMINISTIC[1])
    sampling = {**harness.greedy(), "custom_params": {"ngram_size": 3, "window_size": 96}}
    blocker = ngram_blocker()

    def run(server, concurrency):
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return outputs(list(pool.map(lambda p: server.generate(p, sampling, custom_logit_processor=blocker),
                                         prompts)))

    want = run(plain, 1)
    changed = sum(a != b for a, b in zip(want, outputs(plain.complete_all(prompts, harness.greedy(), 1))))
    record_property("prompts whose NONE answer the processor changed", f"{changed}/{len(prompts)}")
    wrong = []
    for mode, concurrency in (("one by one", 1), ("8 at once", 8)):
        judged = judge_processed(plain, prompts, sampling, want, run(tree, concurrency), custom_logit_processor=blocker)
        record_judged(record_property, f"DDTREE {mode}", judged, len(prompts))
        wrong += judged.wrong
    control = judge_processed(plain, prompts, sampling, want, run(dflash, 1), custom_logit_processor=blocker)
    record_judged(record_property, "SGLang's DFLASH (recorded)", control, len(prompts))
    assert tree.proc.poll() is None, f"{tree.config.name} died: {tree.exit_message()}"
    assert changed > 0
    assert not wrong, wrong[:5]


# --- output logprobs (issue 33, item 1) --------------------------------------------------------------------

LOGPROB_MARGIN = 0.02      # nats above the control's own largest difference (one bf16 step of a log-prob near 2)
LOGPROB_CEILING = 0.5      # nats: a logprob read from the wrong node or before processing is off by about a nat


@pytest.mark.parametrize("scheduler", sorted(TREES))
@pytest.mark.parametrize("concurrency", [1, 8])
def test_output_logprobs_equal_nones(fleet, prompts, concurrency, scheduler, record_property):
    """Greedy with return_logprob and 5 top logprobs: on every token where DDTREE's answer equals NONE's (both
    with deterministic inference), its logprob and top-5 are as close to NONE's as SGLang's own DFLASH's are (the
    control, same numerics: a verify pass's logits against a decode step's): the chosen token's and the top-5's
    largest differences each at most the control's own + LOGPROB_MARGIN, and below LOGPROB_CEILING; every emitted
    token has one. (The H200 run of 2026-12-03 saw DDTREE at max 0.25 / top-5 0.78 on the top-2-of-8 pair with no
    control beside it; the second run, with the control, DFLASH's own top-5 differences reached 0.186 on the dense
    pair - above the fixed 0.1 the test then used, so the bound is the control's, per metric.)"""
    tree_name = LOGPROBS if scheduler == "plain" else TREES[scheduler]
    plain, tree, control = ready(fleet, DETERMINISTIC[0]), ready(fleet, tree_name), ready(fleet, DETERMINISTIC[1])
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
    bound = min(LOGPROB_CEILING, max(control_diffs, default=0.0) + LOGPROB_MARGIN)
    top_bound = min(LOGPROB_CEILING, max(control_top, default=0.0) + LOGPROB_MARGIN)
    record_property("tokens compared", compared)
    record_property("|dlogprob| mean / max", f"{sum(diffs) / len(diffs):.4f} / {max(diffs):.4f}")
    record_property("top-5 |dlogprob| max (same ids)", f"{max(top_diffs):.4f}")
    record_property("DFLASH (control) |dlogprob| max / top-5 max",
                    f"{max(control_diffs, default=0):.4f} / {max(control_top, default=0):.4f}")
    assert compared > len(prompts) * 16
    assert max(diffs) <= bound and max(top_diffs) <= top_bound, (bound, top_bound)
