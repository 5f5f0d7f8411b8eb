"""DDTREE inside the real SGLang 0.5.23 server on the GPU test bed (marker sglang_gpu).

One server per configuration (testbed/servers.py: CONFIGS), the trained byte-level pair exported to SGLang's
formats. What is checked, each test able to fail:
- the export: SGLang's next-token log-probs on the prompts equal the reference engine's (bf16),
  and DFLASH's verify steps equal the reference's offline chain count within 5%;
- temperature 0: every DDTREE configuration emits the no-speculation server's tokens, one
  request at a time and 8 at once, with a real accept length;
- the chain setting (budget = block - 1, cap 1) gives DFLASH's tokens and accept lengths;
- temperature 0.7 / top-p 0.9 / top-k 50: the 4th token's distribution matches the
  no-speculation server's (two-sample chi-square), and the test rejects a server at 1.0;
- /metrics has the accept length; bad settings stop the server with the plugin's message; an
  unsupported request gets an error naming the field; graph runs log no eager fallback and no
  graph-input error.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest


from testbed import servers as harness
from tests.helpers import two_sample_chi_square_pvalue
from testbed.partings import STRICT_LIMIT, PlainModel, strict_walk  # noqa: E402
from testbed.referee import Referee, bf16_served_pair, gap_to, target_referee  # noqa: E402

pytestmark = pytest.mark.sglang_gpu

SAMPLES = 2000
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "ignore_eos": True}


def ready(fleet, name: str) -> harness.Server:
    server = fleet.get(name)
    if server.ready_after is None:
        pytest.fail(f"{name} did not become healthy: {server.exit_message()}")
    return server


def outputs(answers: list[dict]) -> list[list[int]]:
    bad = [a for a in answers if "output_ids" not in a]
    assert not bad, f"{len(bad)} requests failed, e.g. {bad[0]}"
    return [a["output_ids"] for a in answers]


def mean_accept(answers: list[dict]) -> float:
    return statistics.fmean(a["meta_info"]["spec_accept_length"] for a in answers)


@pytest.fixture(scope="session")
def none_greedy(fleet, prompts) -> list[list[int]]:
    return outputs(ready(fleet, "none").complete_all(prompts, harness.greedy(), 1))


def plain_decoding(plain: harness.Server, exact: Referee | None = None) -> PlainModel:
    """What the walks of partings.py ask of plain decoding, from a NONE server (and the float32 referee, if any)."""
    return PlainModel(next_top=plain.next_top,
                      continue_greedy=lambda context, n: plain.generate(context, harness.greedy(n))["output_ids"],
                      float32_logprobs=None if exact is None else exact.logprobs)


def near_ties_against_plain(plain: harness.Server, prompt: list[int], want: list[int], have: list[int],
                            limit: int = STRICT_LIMIT, exact: Referee | None = None) -> tuple[list, str | None]:
    """Walk `have` (a speculative output) against plain decoding `want` (partings.strict_walk). Each parting is
    judged by referee.judge (a bf16 near tie of plain decoding's own; with `exact`, the float32 model's verdict);
    a passed one re-anchors plain decoding on `have`'s prefix, which must then give `have`'s remaining
    tokens, and so on. Returns the partings met (Parting.record: the bf16 gap of a near tie, else
    (kind, bf16 gap, float32 gap)) and the first real difference (None if none)."""
    return strict_walk(plain_decoding(plain, exact), prompt, want, have, limit)


def compare_with_plain(plain: harness.Server, prompts: list[list[int]], want: list[list[int]],
                       have: list[list[int]], exact=None) -> tuple[int, list, list[tuple[int, str]]]:
    """Outputs `have` against plain decoding's `want`, prompt by prompt: how many are identical, the
    partings re-anchored, and the real differences (prompt index, where and why)."""
    same, ties, wrong = 0, [], []
    for i, (w, h) in enumerate(zip(want, have)):
        same += w == h
        if w != h:
            gaps, difference = near_ties_against_plain(plain, prompts[i], w, h, exact=exact)
            ties += gaps
            if difference:
                wrong.append((i, difference))
    return same, ties, wrong


# --- the export -----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def reference():
    """The reference pair on the GPU in float32, its weights rounded to bf16 as the export stores them:
    what SGLang computes, without SGLang's bf16 activations."""
    import os

    return bf16_served_pair(Path(os.environ["SGLANG_DDTREE_REF"]), "cuda")


def is_moe(reference) -> bool:
    """A target whose expert routing is a choice bf16 rounding can flip: MoE layers (first_k_dense_replace below the
    layer count) choosing fewer experts than there are. The Kimi-shaped pairs with dense MLPs or with every expert
    active (training/train_pair.py kimi-dense, kimi-allexp) keep the dense pair's strict rule (issue 44)."""
    cfg = reference.target.config
    experts = int(getattr(cfg, "n_routed_experts", 0) or 0)
    moe_layers = cfg.num_hidden_layers - int(getattr(cfg, "first_k_dense_replace", 0) or 0)
    return experts > 0 and moe_layers > 0 and int(cfg.num_experts_per_tok) < experts


@pytest.fixture(scope="session")
def exact(reference):
    """The float32 referee of a parting (referee.py): the reference engine with the export's bf16 weights, for
    a mixture-of-experts target only: there SGLang's own paths part from plain one-at-a-time decoding well
    past one bf16 step (on the Kimi-shaped pair, H200 2026-12-02: DFLASH at a plain top-2 gap of 0.59, NONE
    with the radix cache at 0.094), so a parting is judged by the model without bf16's rounding. A dense
    target keeps the strict near-tie rule (None)."""
    return target_referee(reference.target, "cuda") if is_moe(reference) else None


def test_export_gives_the_reference_targets_next_token_logprobs(fleet, prompts, reference, record_property):
    import torch

    server = ready(fleet, "none")
    diffs, top1_diff = [], 0
    for p in prompts[:8]:
        r = server.generate(p, harness.greedy(1), return_logprob=True, logprob_start_len=0, top_logprobs_num=5)
        theirs = r["meta_info"]["input_top_logprobs"][1:]                 # after tokens 0..n-2
        with torch.no_grad():
            logits = reference.target.forward_sequence(torch.tensor([p], device="cuda")).logits[0]
            logp = torch.log_softmax(logits.float(), -1)
        for pos, top in enumerate(theirs):
            diffs += [abs(float(logp[pos, tok]) - lp) for lp, tok, *_ in top]
            ours = logp[pos].topk(2)
            if int(ours.indices[0]) != top[0][1] and float(ours.values[0] - ours.values[1]) > 0.05:
                top1_diff += 1
    diffs.sort()
    record_property("|dlogp| top-5 mean / p99 / max", f"{statistics.fmean(diffs):.4f} / "
                    f"{diffs[int(0.99 * len(diffs))]:.4f} / {diffs[-1]:.4f}")
    record_property("positions", len(diffs) // 5)
    record_property("top-1 differences (reference gap > 0.05)", top1_diff)
    # bf16 activations over 6 layers: a few hundredths on average; an export with a wrong
    # weight or layer order is off by whole nats and changes the top-1 token. A mixture-of-experts target's
    # single worst position is recorded, not bounded: on the Kimi-shaped pair (H200, 2026-12-02) one of 548
    # positions moved by 1.0 nat with its top-1 token unchanged and the 99th percentile at 0.14 - what a
    # routing choice flipped by bf16 rounding does (not traced to the expert)
    assert statistics.fmean(diffs) < 0.05 and top1_diff == 0
    assert diffs[int(0.99 * len(diffs))] < 0.25
    assert is_moe(reference) or diffs[-1] < 0.5


def test_dflash_verify_steps_match_the_reference_offline_chain(fleet, prompts, reference, record_property):
    from ddtree.reference.offline import offline_accept_lengths

    ref = reference
    depth = ref.block_size - 1
    long = outputs(ready(fleet, "none").complete_all(prompts, harness.greedy(2 * harness.MAX_NEW_TOKENS), 1))
    answers = ready(fleet, "dflash").complete_all(prompts, harness.greedy(), 1)
    emitted = harness.MAX_NEW_TOKENS - 1                     # the first token comes from the prefill
    sglang_steps = sum(a["meta_info"]["spec_verify_ct"] for a in answers)
    ref_steps = sum(len(offline_accept_lengths(ref, p, c, budget=depth, topk_cap=1, max_new_tokens=emitted))
                    for p, c in zip(prompts, long))
    record_property("DFLASH verify steps", sglang_steps)
    record_property("reference offline steps", ref_steps)
    record_property("DFLASH accept length", round(mean_accept(answers), 3))
    assert abs(sglang_steps - ref_steps) <= 0.05 * ref_steps


# --- temperature 0 --------------------------------------------------------------------------

@pytest.mark.parametrize("name", [c.name for c in harness.MATRIX])
def test_ddtree_greedy_equals_no_speculation(fleet, name, prompts, none_greedy, exact, record_property):
    server = ready(fleet, name)
    one_by_one = server.complete_all(prompts, harness.greedy(), 1)
    eight = server.complete_all(prompts, harness.greedy(), 8)
    record_property("accept length", round(mean_accept(one_by_one), 3))
    record_property("accept length (8 at once)", round(mean_accept(eight), 3))
    plain, identical, ties, wrong = fleet.get("none"), 0, [], []
    for mode, got in (("one by one", outputs(one_by_one)), ("8 at once", outputs(eight))):
        same, gaps, differences = compare_with_plain(plain, prompts, none_greedy, got, exact)
        identical += same
        ties += gaps
        wrong += [(mode, i, difference) for i, difference in differences]
    record_property("identical to NONE", f"{identical}/{2 * len(prompts)}")
    record_property("partings re-anchored (how far below NONE's best; else (verdict, that gap, float32 gap): referee.py)", ties)
    record_property("real differences", wrong)
    assert not wrong
    assert mean_accept(one_by_one) > 1.5, "a trained pair must accept well above one token per step"


def chain_dflash_partings(plain: harness.Server, prompts, chain: list[list[int]], dflash: list[list[int]]) -> list:
    """Where the chain's and DFLASH's answers part, prompt by prompt: (prompt index, position, chain's token,
    DFLASH's token, how far each lies below plain decoding's best on the shared prefix)."""
    out = []
    for i, (c, d) in enumerate(zip(chain, dflash)):
        if c != d and (at := harness.first_divergence(c, d)) < min(len(c), len(d)):
            top = plain.next_top(prompts[i] + c[:at])
            out.append((i, at, c[at], d[at], round(gap_to(top, c[at]), 5), round(gap_to(top, d[at]), 5)))
    return out


def chain_rule(fleet, prompts, none_greedy, reference, exact, chain_name: str) -> tuple[dict, list[str]]:
    """The chain server `chain_name` against DFLASH: what was measured, and which of the rules below it broke (none:
    it is DFLASH's chain). Accept lengths within 1%; where the answers part, both only at near ties of plain decoding
    (referee.py; the float32 referee on a mixture-of-experts target, whose routing flips too) and, on a target
    without routing choices, on no more prompts than chain_parting_allowance."""
    chain = ready(fleet, chain_name).complete_all(prompts, harness.greedy(), 1)
    dflash = ready(fleet, "dflash").complete_all(prompts, harness.greedy(), 1)
    same_tokens = sum(a == b for a, b in zip(outputs(chain), outputs(dflash)))
    same_steps = sum(a["meta_info"]["spec_verify_ct"] == b["meta_info"]["spec_verify_ct"] for a, b in zip(chain, dflash))
    measured = {"same tokens": f"{same_tokens}/{len(prompts)}", "same verify steps": f"{same_steps}/{len(prompts)}",
                "accept length chain / DFLASH": f"{mean_accept(chain):.3f} / {mean_accept(dflash):.3f}"}
    broken = []
    if abs(mean_accept(chain) - mean_accept(dflash)) > 0.01 * mean_accept(dflash):
        broken.append("accept lengths more than 1% apart")
    if same_tokens == len(prompts):
        return measured, broken
    plain = fleet.get("none")
    measured["partings (prompt, position, chain's token, DFLASH's, each below NONE's best)"] = \
        chain_dflash_partings(plain, prompts, outputs(chain), outputs(dflash))
    wrong, identical = {}, {}
    for name, answers in (("chain", chain), ("DFLASH", dflash)):
        identical[name], ties, wrong[name] = compare_with_plain(plain, prompts, none_greedy, outputs(answers), exact)
        measured[f"{name} partings from NONE re-anchored"] = ties
    measured["real differences"] = wrong
    broken += [f"{name}: real differences from NONE" for name in wrong if wrong[name]]
    if not is_moe(reference):
        allowed = chain_parting_allowance(len(prompts), len(prompts) - identical["DFLASH"])
        measured["prompts parting chain / DFLASH, allowed"] = f"{len(prompts) - same_tokens}, {allowed}"
        if len(prompts) - same_tokens > allowed:
            broken.append("the chain parts from DFLASH on too many prompts")
    return measured, broken


def test_chain_setting_equals_dflash(fleet, prompts, none_greedy, reference, exact, record_property):
    """The chain (budget 7, cap 1) drafts and verifies what DFLASH does: the same tokens and verify steps, prompt
    for prompt, with accept lengths within 1% (chain_rule). Where the two part (H200 2026-12-03: 1 of 16 prompts on
    the MLA + dense-MLP pair, none on the dense and all-experts pairs), a different draft order or verify split sums
    the same attention in another order, so the parting must be one bf16 may flip."""
    measured, broken = chain_rule(fleet, prompts, none_greedy, reference, exact, harness.CHAIN.name)
    for key, value in measured.items():
        record_property(key, value)
    assert not broken, broken


def test_chain_setting_one_token_short_fails_the_chain_rule(fleet, prompts, none_greedy, reference, exact,
                                                           record_property):
    """The control of the test above: the chain with the drop-leaf fault worker (SGLANG_DDTREE_FAULT=drop-leaf: each
    step verifies 6 of DFLASH's 7 drafted tokens, still exact) must break chain_rule - its accept length falls
    wherever a step would have accepted all 7."""
    measured, broken = chain_rule(fleet, prompts, none_greedy, reference, exact, harness.CHAIN.name + "-dropleaf")
    for key, value in measured.items():
        record_property(key, value)
    record_property("rules broken", broken)
    assert "accept lengths more than 1% apart" in broken, measured


def chain_parting_allowance(prompts: int, dflash_from_none: int) -> int:
    """How many prompts the chain may part from DFLASH on, both at near ties: one in eight, or as many as DFLASH
    itself parts from NONE on where that is more - two decoders of the same function whose sums run in another order,
    measured beside it in the same numerics. On the bf16 pairs DFLASH parts from NONE rarely and the rule is one in
    eight; on the pair enlarged to a rank's widths with INT4 experts it parted on 5 of 16 (H100 2026-12-07 09:33), and
    the chain from DFLASH on 3, all at near ties, where one in eight allowed 2 (issue 69 item 3)."""
    return max(prompts // 8, dflash_from_none)


# --- temperature > 0 ------------------------------------------------------------------------

def fourth_tokens(server: harness.Server, prompt: list[int], sampling: dict, n: int) -> list[int]:
    answers = server.complete_all([prompt] * n, {**sampling, "max_new_tokens": 4}, 16)
    return [o[3] for o in outputs(answers)]


def entropy(tokens: list[int]) -> float:
    counts = [tokens.count(t) / len(tokens) for t in set(tokens)]
    return -sum(p * math.log(p) for p in counts)


def test_sampling_distribution_matches_no_speculation(fleet, prompts, record_property):
    none, tree = ready(fleet, "none"), ready(fleet, "ddtree-b32-c8-graphs")
    # the prompt whose 4th token is least predictable: a test with power
    prompt = max(prompts[:8], key=lambda p: entropy(fourth_tokens(none, p, SAMPLING, 200)))
    plain = fourth_tokens(none, prompt, SAMPLING, SAMPLES)
    spec = fourth_tokens(tree, prompt, SAMPLING, SAMPLES)
    hot = fourth_tokens(tree, prompt, {**SAMPLING, "temperature": 1.0}, SAMPLES)
    p_same = two_sample_chi_square_pvalue(plain, spec)
    p_control = two_sample_chi_square_pvalue(plain, hot)
    answers = tree.complete_all(prompts, {**SAMPLING, "max_new_tokens": harness.MAX_NEW_TOKENS}, 8)
    record_property("p (DDTREE 0.7 vs NONE 0.7)", f"{p_same:.3g}")
    record_property("p control (DDTREE 1.0 vs NONE 0.7)", f"{p_control:.3g}")
    record_property("4th-token outcomes", len(set(plain)))
    record_property("accept length at 0.7", round(mean_accept(answers), 3))
    assert len(outputs(answers)) == len(prompts)
    assert p_same > 1e-3
    assert p_control < 1e-3


# --- operations -----------------------------------------------------------------------------

def test_metrics_report_the_accept_length(fleet):
    text = ready(fleet, "ddtree-b32-c8-graphs").metrics()
    assert "sglang:spec_accept_length" in text


BAD_SETTINGS = [
    (0, 8, "--speculative-ddtree-budget=0 is invalid"),
    (8, 16, "--speculative-ddtree-topk-cap=16 is invalid: expected 1..budget (8)"),
    (4, 1, "the draft's block must fit in the verify window"),
]


def test_bad_settings_stop_the_server_with_the_plugins_message(pair, tmp_path, record_property):
    servers = [harness.Server(harness.ServerConfig(f"bad-b{b}-c{c}", "DDTREE", b, c), 31900 + i,
                              tmp_path / f"bad-{i}.log") for i, (b, c, _) in enumerate(BAD_SETTINGS)]
    for s in servers:
        s.start(pair)
    try:
        for s in servers:
            s.proc.wait(timeout=300)
    finally:
        for s in servers:
            s.stop()
    for s, (_, _, message) in zip(servers, BAD_SETTINGS):
        assert s.proc.returncode != 0, f"{s.config.name} started"
        assert message in s.log_text(), f"{s.config.name}: {s.exit_message()}"
    record_property("refused", [s.config.name for s in servers])


def test_unsupported_request_gets_an_error_naming_the_field(fleet, prompts):
    server = ready(fleet, "ddtree-b32-c8-graphs")
    r = server.generate(prompts[0], harness.greedy(8), return_logprob=True)
    assert r.get("http_status") == 400 and "return_logprob" in r["error"]
    r = server.generate(prompts[0], {**harness.greedy(8), "frequency_penalty": 0.5})
    assert r.get("http_status") == 400 and "frequency_penalty" in r["error"]
    assert "output_ids" in server.generate(prompts[0], harness.greedy(8))      # still serving


def test_graph_runs_logged_no_eager_fallback_and_no_graph_input_error(fleet):
    """Last (file order): every graph server this session started, after all requests above."""
    # (a server that never became healthy is reported by its own test)
    checked = [s for s in fleet.servers.values()
               if s.config.graphs and s.config.algorithm == "DDTREE" and s.ready_after is not None]
    assert checked
    for s in checked:
        log = s.log_text()
        assert "Capture cuda graph" in log or "capture" in log.lower(), f"{s.config.name}: no graph capture logged"
        for bad in ("GraphBufferError", "DDTREE verify ran eagerly", "DDTREE draft ran eagerly"):
            assert bad not in log, f"{s.config.name}: {bad}"
