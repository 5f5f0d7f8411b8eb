"""The batch's penalty state as of the tree roots, read from SGLang 0.5.23's penalizer orchestrator
(`sampling_info.penalizer_orchestrator`) into ddtree.penalties.PenaltyState. No SGLang import: the
penalizers are found by class name and read by their 0.5.23 attribute names (a contract test runs
them: tests/sglang/test_penalties.py). Only prepared penalizers count (SGLang prepares one when a
request in the batch uses it).

Where the orchestrator is: SGLang 0.5.23's scheduler runs every forward on a copy of the batch's sampling info
(Scheduler._forward_isolation -> SamplingBatchInfo.copy_for_forward) whose penalizer_orchestrator is None, the
penalties pre-accumulated once at the step start into acc_additive_penalties / acc_scaling_penalties. That serves a
step that samples one token per request; DDTREE needs the orchestrator itself (each node's penalties depend on its
own path, and the worker feeds the tokens a step commits). The plugin's AFTER hook on copy_for_forward
(keep_orchestrator) leaves the copy a reference to the scheduler's own orchestrator under KEPT; SGLang's code never
reads that name, so nothing of SGLang applies it a second time. Without it the worker saw no orchestrator and served
every penalty as none (the H200 run of 2026-12-03: DDTREE's penalised answers were SGLang's DFLASH's, which ignores
penalties the same way, token for token).
"""

from __future__ import annotations

import torch

from ddtree.penalties import PenaltyState


FORWARD_COPY = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward"
KEPT = "ddtree_penalizer_orchestrator"


def keep_orchestrator(result, info, *args, **kwargs):
    """AFTER hook on SGLang 0.5.23's SamplingBatchInfo.copy_for_forward(self): the forward's copy keeps a reference
    to the scheduler's penalizer orchestrator (the same object, not a copy: what the worker feeds persists)."""
    if result is not None and getattr(info, "penalizer_orchestrator", None) is not None:
        setattr(result, KEPT, info.penalizer_orchestrator)
    return result


def orchestrator_of(info):
    """The batch's penalizer orchestrator: the one the forward copy kept, else the sampling info's own (a batch
    that was not copied for the forward), else None."""
    if info is None:
        return None
    return getattr(info, KEPT, None) or getattr(info, "penalizer_orchestrator", None)


def penalties_required(info) -> bool:
    """Whether any request of the batch has a penalty or min_new_tokens (SGLang's own check reads only the copy's
    field, which is None during a forward)."""
    orchestrator = orchestrator_of(info)
    return orchestrator is not None and bool(orchestrator.is_required)


def _prepared(orchestrator) -> dict[str, object]:
    return {type(p).__name__: p for p in orchestrator.penalizers.values() if p.is_prepared()}


def penalty_state(orchestrator, bs: int, vocab: int, device) -> PenaltyState | None:
    """None when no request of the batch has a penalty or min_new_tokens."""
    if orchestrator is None or not orchestrator.is_required:
        return None
    pens = _prepared(orchestrator)
    freq, pres = pens.get("BatchedFrequencyPenalizer"), pens.get("BatchedPresencePenalizer")
    rep, hold = pens.get("BatchedRepetitionPenalizer"), pens.get("BatchedMinNewTokensPenalizer")
    zeros = torch.zeros(bs, device=device)
    additive = None
    if freq is not None or pres is not None:
        additive = torch.zeros(bs, vocab, dtype=torch.float32, device=device)
        if freq is not None:
            additive -= freq.cumulated_frequency_penalties[:, :vocab]
        if pres is not None:
            additive -= pres.cumulated_presence_penalties[:, :vocab]
    seen = torch.zeros(bs, vocab, dtype=torch.bool, device=device)
    if pres is not None:
        seen |= pres.cumulated_presence_penalties[:, :vocab] != 0
    if rep is not None:
        seen |= rep.cumulated_repetition_penalties[:, :vocab] != 1
    return PenaltyState(
        additive=additive,
        scaling=None if rep is None else rep.cumulated_repetition_penalties[:, :vocab],
        frequency=zeros if freq is None else freq.frequency_penalties.view(bs).float(),
        presence=zeros if pres is None else pres.presence_penalties.view(bs).float(),
        repetition=torch.ones(bs, device=device) if rep is None else rep.repetition_penalties.view(bs).float(),
        seen=seen,
        out_len=torch.zeros(bs, dtype=torch.int64, device=device) if hold is None
        else hold.len_output_tokens.view(bs).to(torch.int64),
        min_new_tokens=torch.zeros(bs, dtype=torch.int64, device=device) if hold is None
        else hold.min_new_tokens.view(bs).to(torch.int64),
        stop=None if hold is None else torch.isneginf(hold.stop_token_penalties[:, :vocab]))


def feed_committed(orchestrator, tokens: torch.Tensor, counts: torch.Tensor) -> None:
    """Count a DDTREE step's accepted draft tokens in SGLang's penalizers (the bonus is counted as the next
    step's root: the worker feeds the root before each step, as NONE's decode preparation feeds its last
    token, which SGLang 0.5.23's DFLASH-family preparation does not). Each penalizer's state gets the same
    update it does for one token. tokens int64 [bs, L+1] (verdict.tokens: accepted tokens, then the bonus,
    -1 padded); counts int64 [bs]: accepted draft tokens (verdict.accept_len). No host synchronisation.
    """
    if orchestrator is None or not orchestrator.is_required:
        return
    pens = _prepared(orchestrator)
    freq, pres = pens.get("BatchedFrequencyPenalizer"), pens.get("BatchedPresencePenalizer")
    rep, hold = pens.get("BatchedRepetitionPenalizer"), pens.get("BatchedMinNewTokensPenalizer")
    depth = tokens.shape[1] - 1
    ids = tokens[:, :depth].clamp(min=0)                                          # [bs, L]
    counted = torch.arange(depth, device=tokens.device)[None, :] < counts[:, None]   # [bs, L]
    if freq is not None:
        freq.cumulated_frequency_penalties.scatter_add_(
            1, ids, freq.frequency_penalties.expand(-1, depth) * counted)
    # presence and repetition set a value per token: every slot naming a counted token writes the new value
    # (slots naming the same token write the same thing), the others write back what is there
    hit = ((ids[:, :, None] == ids[:, None, :]) & counted[:, None, :]).any(dim=-1)   # [bs, L]
    for pen, attr, value in ((pres, "cumulated_presence_penalties", "presence_penalties"),
                             (rep, "cumulated_repetition_penalties", "repetition_penalties")):
        if pen is not None:
            state = getattr(pen, attr)
            now = state.gather(1, ids)
            state.scatter_(1, ids, torch.where(hit, getattr(pen, value).expand(-1, depth).to(state.dtype), now))
    if hold is not None:
        hold.len_output_tokens += counts.view(-1, 1).to(hold.len_output_tokens.dtype)
