"""The verdict of a DDTREE decode step inside SGLang 0.5.23 (the worker's stage after the verify pass).

Stages, each a function:
  node_logits        the verify pass's logits at every node [bs, N, V], gathered across TP ranks (or, greedy with
                     nothing to process under a deferred TP gather, only the argmax per node)
  process_nodes      NONE's logit processing at every node, in its sampler's order: penalties with the node's own
                     path counted (penalty_state.py, ddtree.penalties), logit bias, the grammar's mask at the
                     node's own state, custom logit processors seeing the node's own path (logit_processors.py)
  choose_tokens      the target's token at every node: argmax; with a seed under deterministic inference,
                     SGLang's seeded draw at the node's position (seeded.py); else one sample of the node's
                     processed distribution (temperature, top-k, top-p, min-p)
  decide             the above, rank 0's tokens on every rank, the walk from the root -> Decided (the Verdict
                     and the gathered logits), and the accepted draft tokens fed to SGLang's penalizers (the
                     root is fed before, by node_penalties: SGLang's DFLASH-family decode preparation feeds none)
  committed_logprobs the committed tokens' logprobs from their path's nodes, by SGLang's compute_spec_logprobs,
                     returned as the logits output's fields (the commit puts them on the output it returns)

The target's verify output is read, never written: the gathered logits come back in Decided.

No host synchronisation here but the processors' (logit_processors.py waits once, in steps with one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

from ddtree.penalties import PenaltyState, apply_node_penalties
from ddtree.sglang.step.glue import sampling_params_from_sglang
from ddtree.sglang.step.logit_processors import apply_node_processors
from ddtree.sglang.step.penalty_state import feed_committed, orchestrator_of, penalties_required, penalty_state
from ddtree.sglang.step.seeded import seeded_node_targets
from ddtree.types import DraftTree
from ddtree.verify import Verdict, accept_path, node_targets


def step_paths(tree: DraftTree) -> DraftTree:
    """The tree as the penalties count it: each node's own path (the test bed's stale-penalties fault worker
    gives another: diagnostics/faults.py)."""
    return tree


@dataclass(frozen=True)
class VerdictSetup:
    """What the verdict takes from the worker, fixed once its parent's __init__ has run."""

    logits_processor: object | None                 # the target's LogitsProcessor when its TP gather is deferred
    can_skip_logits: Callable[[object, object], bool]   # DFlashWorkerV2._can_skip_verify_logits(batch, info)
    tp_sync: object                                 # SGLang's SpecTpSync: rank 0's tokens on every rank
    penalty_paths: Callable[[DraftTree], DraftTree] = step_paths    # the tree as the penalties count it
    kernels: str | None = None                      # the walk's backend, resolved once (None: DDTREE_BACKEND now)


@dataclass
class NodeLogits:
    """The verify pass's output as the verdict reads it: rows [bs, N, V] float32, or (greedy with nothing to
    process under a deferred gather) the argmax per node, int [bs * N], and no rows; `full` the logits the
    step's output carries on ([bs * N, V], the TP gather finished; None when only the argmax was taken)."""

    rows: torch.Tensor | None
    argmax: torch.Tensor | None
    full: torch.Tensor | None


@dataclass(frozen=True)
class Decided:
    """The verdict stage's result: the walk's Verdict and the verify's logits as processed ([bs * N, V], or None
    when only the argmax was taken), which the commit hands on and the logprobs read."""

    verdict: Verdict
    logits: torch.Tensor | None


def is_greedy(info) -> bool:
    """Every request of the batch at temperature 0 (no sampling info: a plain greedy batch)."""
    return info is None or bool(info.is_all_greedy)


def node_logits(setup: VerdictSetup, batch, info, logits_output, bs: int, n: int) -> NodeLogits:
    """logits_output.next_token_logits [bs * N, V(shard)] -> the node rows, finishing a deferred TP gather, or only
    the argmax when that is all the step needs."""
    logits = logits_output.next_token_logits
    lp = setup.logits_processor
    if lp is not None and lp.is_deferred_shard(logits):
        if is_greedy(info) and setup.can_skip_logits(batch, info) and not penalties_required(info):
            return NodeLogits(rows=None, argmax=lp.deferred_argmax(logits), full=None)   # [bs * N] no full gather
        logits = lp.finish_deferred_gather(logits)
    return NodeLogits(rows=logits.view(bs, n, -1), argmax=None, full=logits)    # [bs, N, V]


def node_penalties(info, rows: torch.Tensor, roots: torch.Tensor) -> PenaltyState | None:
    """The batch's penalty state as of the roots, or None when no request has a penalty. SGLang 0.5.23's
    DFLASH-family decode preparation feeds its penalizers nothing (NONE's feeds the last output token before each
    step), so the root is fed here - the prefill's token, then each step's bonus - and the accepted draft tokens
    after the walk (decide). rows [bs, N, V]; roots int64 [bs]."""
    orchestrator = orchestrator_of(info)                # the scheduler's, kept by the plugin's hook
    if orchestrator is None or not orchestrator.is_required:
        return None
    if rows.shape[-1] != orchestrator.vocab_size:
        raise RuntimeError(f"DDTREE verify logits have {rows.shape[-1]} columns, SGLang's penalizers "
                           f"{orchestrator.vocab_size}: per-node penalties need the same vocabulary")
    orchestrator.cumulate_output_tokens(roots)
    return penalty_state(orchestrator, rows.shape[0], rows.shape[-1], rows.device)


def process_nodes(info, rows: torch.Tensor, tree: DraftTree, grammar_mask=None,
                  penalty_paths: Callable[[DraftTree], DraftTree] = step_paths) -> PenaltyState | None:
    """NONE's logit processing at every node, rows [bs, N, V] in place, in its sampler's order. Returns the
    penalty state (fed the accepted tokens after the walk) or None. (SGLang's DFLASH verify adjustments are not
    used: they broadcast one step-start state over the block.)"""
    if info is None:
        return None
    penalties = node_penalties(info, rows, tree.tokens[:, 0])
    if penalties is not None:
        apply_node_penalties(rows, penalty_paths(tree), penalties)
    if info.logit_bias is not None:
        rows.add_(info.logit_bias[:, None, :].to(rows.dtype))
    flat = rows.view(-1, rows.shape[-1])                                         # [bs * N, V]
    if grammar_mask is not None:
        grammar_mask.apply(flat)
    if info.has_custom_logit_processor:
        apply_node_processors(flat, info, tree)
    return penalties


def choose_tokens(info, rows: torch.Tensor, tree: DraftTree, prefix_lens: torch.Tensor) -> torch.Tensor:
    """The target's token at every node of the processed rows [bs, N, V] -> [bs, N]."""
    if is_greedy(info):
        return rows.argmax(dim=-1)
    if info.sampling_seed is not None:
        return seeded_node_targets(rows, info, tree.positions(prefix_lens))
    return node_targets(rows, sampling_params_from_sglang(info, rows.shape[-1]), generator=None)


def decide(setup: VerdictSetup, batch, tree: DraftTree, logits_output, prefix_lens: torch.Tensor,
           grammar_mask=None) -> Decided:
    """Target tokens at every node (rank 0's on every rank), then the accepted path. grammar_mask: the step's
    per-node bitmask (grammar.py), applied after penalties and logit bias."""
    bs, n = tree.tokens.shape
    info = batch.sampling_info
    out = node_logits(setup, batch, info, logits_output, bs, n)
    penalties = None
    if out.rows is None:
        targets = out.argmax
    else:
        penalties = process_nodes(info, out.rows, tree, grammar_mask, setup.penalty_paths)
        targets = choose_tokens(info, out.rows, tree, prefix_lens)
    targets = targets.view(bs, n).to(torch.int64).contiguous()
    site = SpecTpSyncSite.DFLASH_ACCEPT_GREEDY if is_greedy(info) else SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE
    setup.tp_sync.sync(site, targets)
    verdict = accept_path(tree, targets, setup.kernels)
    if penalties is not None:                    # the accepted draft tokens; the bonus is the next root
        feed_committed(orchestrator_of(info), verdict.tokens, verdict.accept_len)
    return Decided(verdict=verdict, logits=out.full)


LOGPROB_FIELDS = ("next_token_logprobs", "next_token_top_logprobs_val", "next_token_top_logprobs_idx",
                  "next_token_token_ids_logprobs_val", "next_token_token_ids_logprobs_idx")


def committed_logprobs(batch, logits: torch.Tensor, done) -> dict[str, object]:
    """Output logprobs (and top / token-id logprobs) of the committed tokens from the processed verify logits
    [bs * N, V] at their path's nodes, by SGLang's own compute_spec_logprobs in its chain layout (row
    b * (L + 1) + j is request b's committed token j; done.hidden_rows names its node), run on an output of its
    own: its fields come back by name, for the logits output the step returns."""
    if logits is None:
        raise RuntimeError("DDTREE logprobs need the verify logits; the verdict kept only the argmax")
    scratch = LogitsProcessorOutput(next_token_logits=logits.index_select(0, done.hidden_rows.reshape(-1)))
    compute_spec_logprobs(batch, scratch, done.out_tokens.reshape(-1), chain_stride=done.out_tokens.shape[1])
    return {name: getattr(scratch, name) for name in LOGPROB_FIELDS if getattr(scratch, name) is not None}
