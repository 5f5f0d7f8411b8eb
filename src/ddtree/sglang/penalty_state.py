"""The batch's penalty state as of the tree roots, read from SGLang 0.5.23's penalizer orchestrator
(`sampling_info.penalizer_orchestrator`) into ddtree.penalties.PenaltyState. No SGLang import: the
penalizers are found by class name and read by their 0.5.23 attribute names (a contract test runs
them: tests/sglang/test_penalties.py). Only prepared penalizers count (SGLang prepares one when a
request in the batch uses it)."""

from __future__ import annotations

import torch

from ddtree.penalties import PenaltyState


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
