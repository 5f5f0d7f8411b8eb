"""Penalties at every DDTree node (issue 33, item 2) against SGLang 0.5.23's own penalizers, on the CPU.

NONE: a stand-in target (logits a fixed function of the prefix) decoded greedily with SGLang's
BatchedPenalizerOrchestrator applied before each choice and fed each chosen token, as its scheduler
does. DDTREE: trees from a draft that knows the target a little, the node logits penalised by
ddtree.penalties with the state read from the same orchestrator as of the root
(ddtree.sglang.step.penalty_state), the greedy walk, the committed tokens fed to the one orchestrator of
the batch as the worker feeds them (the root before the step, the accepted draft tokens after it), the sampling info
as a real server hands it to the worker (SGLang's forward copy with the plugin's hook). The emitted tokens must be
NONE's for frequency, presence, repetition and
min_new_tokens, alone and together, with requests of different settings in one batch. Runs in the
SGLang contract venv.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("sglang", reason="run in the SGLang contract venv (make test)")

from sglang.srt.sampling import penaltylib  # noqa: E402
from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402

from ddtree import build_tree  # noqa: E402
from ddtree.penalties import apply_node_penalties  # noqa: E402
from ddtree.sglang.diagnostics.step_dump import hide_paths_from_penalties  # noqa: E402
from ddtree.sglang.step.penalty_state import feed_committed, keep_orchestrator, orchestrator_of  # noqa: E402
from ddtree.sglang.step.verdict import node_penalties  # noqa: E402
from ddtree.verify import accept_path  # noqa: E402
from tests.helpers import informed_draft, tree_node_path  # noqa: E402

VOCAB, EOS = 20, 19
# ORDER: SGLang applies the additive penalties (frequency, presence, min_new_tokens) before the scaling one
# (repetition) under its overlap scheduler (acc_additive then acc_scaling) and in speculative verification
# (apply(repeat=...)); its non-overlap NONE path applies the penalizers in the iteration order of a Python
# set of classes, which is not fixed - so with repetition combined with another penalty, NONE itself
# answers differently with the overlap scheduler on and off. ddtree.penalties takes the first order.
PENALIZERS = {penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedMinNewTokensPenalizer,
              penaltylib.BatchedPresencePenalizer, penaltylib.BatchedRepetitionPenalizer}


def target_logits(prefix: list[int]) -> torch.Tensor:
    """A target that loves to repeat itself (a few tokens far ahead) and to stop: what penalties change."""
    g = torch.Generator().manual_seed(hash(tuple(prefix[-2:])) % (2**31))
    logits = torch.randn(VOCAB, generator=g)
    logits[prefix[-1] % 5] += 3.0                 # the last token's family again
    logits[EOS] += 2.5
    return logits


class Batch:
    """What the orchestrator reads of SGLang's ScheduleBatch (it keeps a weak reference to it)."""

    def __init__(self, reqs, device):
        self.reqs, self.device = reqs, device


def orchestrator(settings: list[dict]):
    reqs = [NS(sampling_params=NS(frequency_penalty=s.get("frequency", 0.0), presence_penalty=s.get("presence", 0.0),
                                  repetition_penalty=s.get("repetition", 1.0), min_new_tokens=s.get("min_new", 0),
                                  stop_token_ids=set()),
               eos_token_ids={EOS}, tokenizer=NS(additional_stop_token_ids=None, eos_token_id=None)) for s in settings]
    batch = Batch(reqs, "cpu")
    orch = BatchedPenalizerOrchestrator(vocab_size=VOCAB, batch=batch, penalizers=PENALIZERS)
    orch._keep = batch                                  # the orchestrator holds its batch weakly
    return orch


def one_by_one(orch, repetition_first: bool) -> None:
    """Order the orchestrator's penalizers with repetition (the scaling one) first or last, as SGLang 0.5.23's
    non-overlap NONE path may find them in a process (its dict follows a set of classes, which their addresses
    order), then applied one by one in that order."""
    orch.penalizers = dict(sorted(orch.penalizers.items(),
                                  key=lambda item: item[1].is_multiplicative != repetition_first))


def none_decode(prompts, settings, length, repetition_first: bool | None = None):
    """Greedy NONE as SGLang runs it: each token chosen after the penalties of the output so far, each
    output token fed to the penalizers before the next step. repetition_first: None - SGLang's speculative and
    overlap order (additive, then scaling: see ORDER); True / False - the non-overlap NONE path's one-by-one apply
    with repetition first / last (one_by_one)."""
    orch, seqs = orchestrator(settings), [list(p) for p in prompts]
    if repetition_first is not None:
        one_by_one(orch, repetition_first)
    for _ in range(length):
        logits = torch.stack([target_logits(s) for s in seqs])
        if repetition_first is None:
            orch.apply(logits, repeat=1)                # additive, then scaling: see ORDER
        else:
            orch.apply(logits)
        chosen = logits.argmax(-1)
        orch.cumulate_output_tokens(chosen)
        for s, t in zip(seqs, chosen.tolist()):
            s.append(t)
    return [s[len(p):] for s, p in zip(seqs, prompts)]


def plain_info(orch, bs: int):
    """A batch whose sampling info the worker gets as the scheduler holds it (the orchestrator in its field)."""
    return NS(penalizer_orchestrator=orch)


def sampling_info(orch, bs: int) -> SamplingBatchInfo:
    """SGLang 0.5.23's own SamplingBatchInfo of a greedy batch holding the orchestrator."""
    ones = torch.ones(bs)
    return SamplingBatchInfo(temperatures=ones[:, None], top_ps=ones, top_ks=ones.int(), min_ps=ones * 0,
                             is_all_greedy=True, is_any_greedy=True, need_top_p_sampling=False,
                             need_top_k_sampling=False, need_min_p_sampling=False, vocab_size=VOCAB,
                             penalizer_orchestrator=orch, device="cpu")


def forward_copy(orch, bs: int):
    """What the worker gets in a real server: SGLang's scheduler runs each forward on copy_for_forward()'s copy
    (Scheduler._forward_isolation), and the plugin's AFTER hook (keep_orchestrator) runs on its result."""
    info = sampling_info(orch, bs)
    return keep_orchestrator(info.copy_for_forward(), info)


def unhooked_copy(orch, bs: int):
    """The same copy without the plugin's hook: the orchestrator is gone (the H200 run of 2026-12-03)."""
    return sampling_info(orch, bs).copy_for_forward()


def ddtree_decode(prompts, settings, length, budget=12, cap=3, depth=4, seed=0, stale=False, info_of=plain_info):
    """The worker's flow with one orchestrator for the batch (SGLang 0.5.23's DFLASH-family decode preparation
    feeds the penalizers nothing): the prefill's token; each DDTREE step gets its sampling info from info_of
    (the scheduler's, or the forward copy a real server hands the worker), feeds its roots and reads the state
    through the verdict's own node_penalties, penalises its nodes from that state, walks, and feeds the accepted
    draft tokens (feed_committed). stale: the test bed's deliberate fault stale-penalties (the step start's counts
    at every node, the worker's SGLANG_DDTREE_FAULT=stale-penalties)."""
    gen, seqs, orch = torch.Generator().manual_seed(seed), [list(p) for p in prompts], orchestrator(settings)
    first = torch.stack([target_logits(sq) for sq in seqs])
    orch.apply(first, repeat=1)
    for sq, t in zip(seqs, first.argmax(-1).tolist()):
        sq.append(t)
    steps = 0
    while min(len(sq) - len(p) for sq, p in zip(seqs, prompts)) < length:
        bs = len(seqs)
        info = info_of(orch, bs)
        draft = torch.stack([informed_draft(target_logits, sq, depth, gen, noise=1.5) for sq in seqs])
        tree = build_tree(draft, torch.tensor([sq[-1] for sq in seqs]), budget=budget, topk_cap=cap, backend="torch")
        rows = torch.stack([torch.stack([target_logits(seqs[b][:-1] + tree_node_path(tree, b, j))
                                         for j in range(tree.tokens.shape[1])]) for b in range(bs)])
        state = node_penalties(info, rows, tree.tokens[:, 0])                     # feeds the roots
        if state is not None:
            apply_node_penalties(rows, hide_paths_from_penalties(tree) if stale else tree, state)
        verdict = accept_path(tree, rows.argmax(-1))
        feed_committed(orchestrator_of(info), verdict.tokens, verdict.accept_len)     # the worker, after the walk
        for b in range(bs):
            seqs[b] += verdict.tokens[b, : int(verdict.accept_len[b]) + 1].tolist()
        steps += 1
    return [sq[len(p):len(p) + length] for sq, p in zip(seqs, prompts)], steps


PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]]


@pytest.mark.parametrize("settings", [
    {"frequency": 0.9}, {"presence": 1.5}, {"repetition": 1.8}, {"min_new": 12},
    {"frequency": 0.5, "presence": 0.7, "repetition": 1.3, "min_new": 6},
], ids=["frequency", "presence", "repetition", "min_new_tokens", "all"])
def test_ddtree_with_penalties_gives_nones_tokens(settings):
    batch = [settings, {}, settings, {"repetition": 1.2}]           # a request without, one with another
    want = none_decode(PROMPTS, batch, 24)
    got, steps = ddtree_decode(PROMPTS, batch, 24)
    assert got == want
    assert steps < 24 - 1                                             # trees were accepted past the root
    without = none_decode(PROMPTS, [{}] * 4, 24)
    assert want[0] != without[0] or want[2] != without[2]            # the penalty changed the answer


def test_penalties_reach_the_worker_through_sglangs_forward_copy():
    """In a real server the worker's sampling info is SGLang's forward copy, whose penalizer_orchestrator is None.
    With the plugin's hook (keep_orchestrator) the worker still finds the scheduler's orchestrator and the answers
    are NONE's; without it every penalty is silently ignored (what the H200 run of 2026-12-03 found: DDTREE's
    penalised answers were the unpenalised ones, token for token SGLang's own DFLASH's)."""
    settings = [{"frequency": 0.9, "presence": 0.5, "repetition": 1.4, "min_new": 10}, {}, {"presence": 1.5},
                {"repetition": 1.2}]
    want = none_decode(PROMPTS, settings, 24)
    assert sampling_info(orchestrator(settings), 4).copy_for_forward().penalizer_orchestrator is None   # SGLang's fact
    hooked, _ = ddtree_decode(PROMPTS, settings, 24, info_of=forward_copy)
    assert hooked == want
    unhooked, _ = ddtree_decode(PROMPTS, settings, 24, info_of=unhooked_copy)
    assert unhooked != want


def test_the_plugin_registers_the_hook_on_sglangs_own_forward_copy():
    import importlib

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from ddtree.sglang import plugin
    from ddtree.sglang.step import penalty_state

    module, cls, method = penalty_state.FORWARD_COPY.rsplit(".", 2)
    assert callable(getattr(getattr(importlib.import_module(module), cls), method))
    plugin.register()
    assert (HookType.AFTER, penalty_state.keep_orchestrator) in [(t, h) for t, h, _ in
                                                                 HookRegistry._hooks[penalty_state.FORWARD_COPY]]


def test_the_path_matters_a_step_start_penalty_is_not_enough():
    """The same decoding with the penalties frozen at the root (what a chain verifier broadcasting the step's
    penalty does, and the GPU test bed's deliberate fault stale-penalties) gives other tokens: the per-node path
    corrections are what makes DDTREE equal NONE."""
    settings = [{"frequency": 1.2, "presence": 1.0}] * 4
    want = none_decode(PROMPTS, settings, 24)
    frozen, _ = ddtree_decode(PROMPTS, settings, 24, stale=True)
    assert frozen != want


def test_the_accepted_tokens_must_be_fed():
    """Feeding only one token per request per step (what NONE's decode preparation does) lets the counts
    fall behind on DDTREE, and the answer is not NONE's."""
    global feed_committed
    settings = [{"frequency": 1.0, "presence": 0.8, "min_new": 16}] * 4
    want = none_decode(PROMPTS, settings, 24)
    real = feed_committed
    try:
        feed_committed = lambda *args: None            # noqa: E731 - the roots' feeding alone
        starved, _ = ddtree_decode(PROMPTS, settings, 24)
    finally:
        feed_committed = real
    assert starved != want


def test_sglangs_dflash_decode_preparation_feeds_no_penalizer():
    """What the worker's feeding of the roots relies on: SGLang 0.5.23's DFLASH-family decode preparation
    (DDTREE's) does not feed the penalizers, NONE's does (a version that starts to would count roots twice)."""
    import inspect

    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    assert "cumulate" not in inspect.getsource(DFlashDraftInputV2.prepare_for_decode)
    assert "cumulate_penalty_output_tokens" in inspect.getsource(ScheduleBatch.prepare_for_decode)


def test_repetition_with_an_additive_penalty_depends_on_the_order_and_ddtree_takes_sglangs_speculative_one():
    """Why the GPU test cannot decide repetition combined with frequency or presence (test_requests.ORDER_DEPENDENT):
    SGLang's non-overlap NONE with repetition first gives other tokens than with it last, on the same requests;
    DDTREE gives the tokens of the additive-first order, which the non-overlap path also takes when its set happens
    to put repetition last (one by one in that order = the speculative order's tokens)."""
    settings = [{"frequency": 0.6, "presence": 0.6, "repetition": 2.5}] * 4
    additive_first = none_decode(PROMPTS, settings, 24)
    assert none_decode(PROMPTS, settings, 24, repetition_first=False) == additive_first
    assert none_decode(PROMPTS, settings, 24, repetition_first=True) != additive_first
    got, _ = ddtree_decode(PROMPTS, settings, 24)
    assert got == additive_first


# --- the GPU tests' float32 referee for penalised partings (testbed/referee.py penalised) ------------------

@pytest.mark.parametrize("settings", [{"frequency": 0.6}, {"presence": 0.8}, {"repetition": 1.3}, {"min_new": 6},
                                      {"frequency": 0.3, "presence": 0.3}, {"repetition": 1.1, "min_new": 6},
                                      {"frequency": 0.3, "presence": 0.3, "repetition": 1.1}])
def test_the_referees_penalties_are_sglangs(settings):
    """The referee's penalties on float32 logits equal SGLang's own orchestrator's (fed the same output, applied in
    its speculative order), for every penalty the GPU test sends; a referee that dropped one would pass a wrong
    per-node penalty, so a mismatch here fails."""
    from testbed.referee import penalised

    sampling = {"frequency_penalty": settings.get("frequency", 0.0), "presence_penalty": settings.get("presence", 0.0),
                "repetition_penalty": settings.get("repetition", 1.0), "min_new_tokens": settings.get("min_new", 0),
                "stop_token_ids": [EOS]}
    g = torch.Generator().manual_seed(5)
    for length in (0, 3, 9):
        output = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        logits = torch.randn(VOCAB, generator=g) * 3
        orch = orchestrator([settings])
        for token in output:
            orch.cumulate_output_tokens(torch.tensor([token]))
        theirs = logits[None].clone()
        orch.apply(theirs, repeat=1)
        ours = penalised(logits, output, sampling)
        assert torch.allclose(ours, torch.log_softmax(theirs[0], -1), atol=1e-5), (settings, length)
        if length:                                   # the penalty acts: the referee without it answers otherwise
            assert not torch.allclose(ours, torch.log_softmax(logits, -1), atol=1e-3) or settings == {"min_new": 6}
