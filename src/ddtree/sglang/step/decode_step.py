"""The stages of one DDTREE decode step inside SGLang 0.5.23, in the order the worker runs them
(tree_worker.DDTreeWorker.forward_batch_generation):

  plan_step              the running batch's size and this step's tree (budget, cap) from the width schedule, or
                         with `auto` the width policy's choice (step_policy.py; after the tree, its `observe`
                         queues this step's expectations, after the verdict its `learn` the draft's calibration);
                         the policy's budget 0 is a step without speculation: no draft pass, the tree is the root
                         alone (ddtree.tree.root_only_tree), verified at width 1
  reserve_window         the request's N reserved KV slots this step writes, and SGLang's plan of them
  draft_candidates       the DFlash draft over its own block (bonus token + mask tokens, positions
                         prefix .. prefix + block - 1) in the draft's CUDA graph when one fits; the
                         DraftCandidateHead, folded into that graph, turns the hidden states at depths 1..L
                         into the top-K candidates per depth (TP: per-shard top-K and log-normaliser, one
                         all-gather)
  narrow_candidates      a narrower step's K(cap) candidates: a prefix of the widest step's, best first
  build_tree_from_candidates (ddtree.tree) -> DraftTree of width N = budget + 1
  constrain_to_grammars  (a batch with grammars only) each constrained request's row rebuilt on the host: the
                         budget best paths its grammar allows, and the bitmask of every node (grammar.py)
  hand_to_scheduler      the two writes SGLang's scheduler reads off its batch (the window's slots; a grammar
                         batch's leftover mask dropped)
  verify_forward_batch   the target's TARGET_VERIFY batch of N tokens per request: the tree's tokens at
                         positions prefix + depth, the FULL_MASK custom mask (each node sees the prefix, its
                         ancestors and itself), K/V written to the request's reserved window
  run_verify             that one pass (CUDA graphs captured at width N; a schedule's narrower widths have
                         their own attention backend and graphs, swapped in around the pass: widths.py)
  verdict.decide         NONE's processing at every node, the target's token at every node, rank 0's for every
                         rank, the walk from the root -> Decided (the Verdict and the gathered logits);
                         penalty feeding
  commit                 the window permuted so the accepted path's slots come first (page size 1: no K/V
                         moves), the draft's context extended with the target hidden states of the path;
                         tokens [bs, block] for the scheduler, commit lengths, the next root, the logprobs

Each stage takes what it reads and returns what it makes: `view` is the StepView (step/view.py), the read-only
record of what SGLang owns (model runners, token table, KV translators, the draft's buffers), built once after
the worker's graphs. No stage takes the worker or writes the target's output, and only hand_to_scheduler writes
the scheduler's batch (what SGLang's scheduler reads off it, in one place). No stage waits for the device: host
lengths come from the scheduler's own host copies (under the overlap scheduler its reservation,
nxt_kv_lens_cpu), as DFlashWorkerV2 does.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field

import torch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (CaptureHiddenMode, ForwardBatch, ForwardMode,
                                                          enable_num_token_non_padded)
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import draft_tp_context

from ddtree.sglang.step.glue import commit_step, verify_mask, window_slots
from ddtree.sglang.step.grammar import GrammarStep, constrain_step
from ddtree.sglang.step.verdict import Decided, committed_logprobs
from ddtree.sglang.step.view import StepView
from ddtree.settings import WidthSchedule
from ddtree.tree import candidate_count
from ddtree.types import Candidates, DraftTree

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepPlan:
    """What a decode step knows before any stage runs."""

    prefix_lens: torch.Tensor   # int64 [bs] committed tokens (their KV is in the pool), on the device
    bs: int                     # running requests: a shape, no device wait
    budget: int                 # this step's tree: the root + budget nodes
    cap: int                    # this step's top-k cap per node

    @property
    def width(self) -> int:
        """N: the tree's rows per request (root included)."""
        return self.budget + 1

    @property
    def speculates(self) -> bool:
        """False for the width policy's step without speculation (budget 0: the root alone, no draft pass)."""
        return self.budget > 0


@dataclass
class StepWindow:
    """The KV slots of one decode step."""

    slots: torch.Tensor   # int64 [bs, N]  req_to_token[r, prefix : prefix + N] (virtual ids)
    plan: object          # SGLang KVLocPlan over slots (the draft writes its first `block` columns)


@dataclass(frozen=True)
class HostLens:
    """Host upper bounds of the lengths a pass reads (no device wait)."""

    lens: torch.Tensor    # int64 [bs] on the host
    total: int


@dataclass
class EagerPasses:
    """Passes that ran eagerly although graphs are on: said once per (stage, batch size)."""

    seen: set[tuple[str, int]] = field(default_factory=set)

    def note(self, stage: str, bs: int) -> None:
        if (stage, bs) not in self.seen:
            self.seen.add((stage, bs))
            logger.warning("DDTREE %s ran eagerly for batch size %d (no captured CUDA graph fits it)", stage, bs)


def plan_step(batch, schedule: WidthSchedule, policy=None) -> StepPlan:
    """The step's size and tree: the width policy's choice (host work: step_policy.py) or the schedule's."""
    prefix_lens = batch.seq_lens                                                   # int64 [bs]
    bs = int(prefix_lens.shape[0])                                                 # a shape: no device wait
    if policy is not None:
        option = policy.choose(bs, speculate=batch.has_grammar)
        budget, cap = option.budget, option.cap
    else:
        budget, cap = schedule.at(bs)
    return StepPlan(prefix_lens=prefix_lens, bs=bs, budget=budget, cap=cap)


def host_lens(batch, draft_input, extra: int) -> HostLens:
    """Committed + extra, or the reserved lengths when the scheduler keeps no committed ones on the host."""
    lens = batch.seq_lens_cpu + extra if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu.clone()
    return HostLens(lens=lens, total=int(lens.sum()))


def reserve_window(view: StepView, batch, draft_input, plan: StepPlan) -> StepWindow:
    """The step's N reserved slots per request and their KV plan (read extent N; SGLang reserved the widest
    step's window)."""
    slots = window_slots(view.req_to_token, batch.req_pool_indices, plan.prefix_lens, plan.width)   # [bs, N]
    seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu
    kv_plan = view.target_kv.plan(
        req_pool_indices=batch.req_pool_indices, seq_lens=plan.prefix_lens, seq_lens_cpu=seq_lens_cpu,
        write_virtual=slots.reshape(-1), read_extent=plan.width)
    return StepWindow(slots=slots, plan=kv_plan)


def block_embeddings(view: StepView, block_ids: torch.Tensor) -> torch.Tensor:
    """block_ids int64 [bs, block] -> the draft's input embeddings [bs * block, H] (the target's table)."""
    if view.full_embed is not None:
        emb = torch.nn.functional.embedding(block_ids, view.full_embed)
    else:
        emb = view.embedding(block_ids)
    if view.embed_scale != 1.0:
        emb = emb * view.embed_scale
    return emb.view(-1, emb.shape[-1])


def draft_candidates(view: StepView, batch, draft_input, plan: StepPlan, window: StepWindow, head,
                     eager: EagerPasses) -> Candidates:
    """One DFlash draft pass over its block -> Candidates [bs, L, K] (the widest step's K)."""
    bs, block = plan.bs, view.block
    block_ids = torch.full((bs, block), view.mask_token_id, dtype=torch.int64, device=view.device)
    block_ids[:, 0] = draft_input.bonus_tokens.view(-1)                          # slot 0: the bonus token
    positions = plan.prefix_lens[:, None] + view.block_pos_offsets               # [bs, block]
    lens = host_lens(batch, draft_input, block)
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.reshape(-1),
        req_pool_indices=batch.req_pool_indices, seq_lens=plan.prefix_lens,
        out_cache_loc=window.slots[:, :block].reshape(-1), seq_lens_sum=lens.total,
        seq_lens_cpu=lens.lens, positions=positions.reshape(-1),
        input_embeds=block_embeddings(view, block_ids), spec_algorithm=SpeculativeAlgorithm.DFLASH,
        spec_info=view.draft_spec_info, capture_hidden_mode=CaptureHiddenMode.NULL,
        num_token_non_padded=(torch.full((), bs * block, dtype=torch.int32, device=view.device)
                              if enable_num_token_non_padded() else None),
        global_num_token_non_padded_cpu=bs * block,
        can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph)
    window.plan.bind(forward_batch, view.draft_kv, cols=slice(0, block))
    with torch.inference_mode(), draft_tp_context(view.draft_layout):
        out = view.draft_runner.forward(forward_batch)
        if view.head_in_graph and out.can_run_graph:
            return head.captured(bs)                                             # the graph ran the head
        if view.head_in_graph:
            eager.note("draft", bs)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("the DFlash draft returned no hidden states")
        return head.compute(hidden[: bs * block])


def narrow_candidates(cand: Candidates, plan: StepPlan, vocab: int) -> Candidates:
    """The step's K(cap) candidates per depth [bs, L, K(cap)]: the head keeps the widest step's K, best first, so
    a narrower step's are a prefix."""
    k = candidate_count(plan.cap, plan.budget, vocab)
    if k >= cand.logp.shape[-1]:
        return cand
    return Candidates(logp=cand.logp[..., :k].contiguous(), tokens=cand.tokens[..., :k].contiguous())


def constrain_to_grammars(batch, cand: Candidates, tree: DraftTree, plan: StepPlan, barrier) -> GrammarStep | None:
    """The rows of requests with a grammar rebuilt on the host under it (grammar.py), and the step's bitmask."""
    return constrain_step(batch.reqs, cand, tree, plan.budget, int(batch.sampling_info.vocab_size), barrier)


def hand_to_scheduler(batch, window: StepWindow) -> None:
    """The writes SGLang 0.5.23's scheduler expects of a DFLASH-family verify on its batch, in one place (the
    scheduler snapshots the batch before the forward and restores it after): batch.out_cache_loc names the slots
    this forward wrote (read after the forward, under unified memory, as the forward's write set), and a grammar
    batch's leftover prefill mask is dropped from its sampling info (per request, not per node), as SGLang's
    DFLASH verify drops it."""
    batch.out_cache_loc = window.slots.reshape(-1)                                 # [bs * N] virtual ids
    if batch.has_grammar:
        batch.sampling_info.grammar_mask = None


def verify_forward_batch(view: StepView, batch, draft_input, tree: DraftTree, plan: StepPlan,
                         window: StepWindow) -> ForwardBatch:
    """The target's TARGET_VERIFY ForwardBatch over the N tree nodes of every request (custom mask), made by
    SGLang's prepare_for_verify from a shallow copy of the batch that carries the window and the verify's host
    lengths (prepare_for_verify also rewrites the batch's input ids, spec info and mode: on the copy only)."""
    bs, n = tree.tokens.shape
    committed = host_lens(batch, draft_input, 0)                                    # host upper bounds
    mask = verify_mask(tree, plan.prefix_lens, total=n * (committed.total + bs * n),  # sum_b N * (prefix_b + N)
                       max_prefix=int(committed.lens.max()), backend=view.kernels)
    verify_input = DFlashVerifyInput(
        draft_token=tree.tokens.reshape(-1), positions=mask.positions.reshape(-1),
        draft_token_num=n, custom_mask=mask.custom_mask,
        capture_hidden_mode=CaptureHiddenMode.FULL, kv_loc_plan=window.plan)
    verify_lens = host_lens(batch, draft_input, n)
    lent = copy.copy(batch)                                                         # the scheduler's stays as it is
    lent.out_cache_loc = window.slots.reshape(-1)
    lent.seq_lens_cpu, lent.seq_lens_sum = verify_lens.lens, verify_lens.total
    forward_batch, _ = verify_input.prepare_for_verify(lent, view.target_worker)
    return forward_batch


def run_verify(view: StepView, forward_batch: ForwardBatch, eager: EagerPasses):
    """One target pass over the tree nodes (the captured graph of width N when one fits)."""
    out = view.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch,
                                                      is_verify=True, skip_attn_backend_init=True)
    if view.target_has_graphs and not out.can_run_cuda_graph:
        eager.note("verify", forward_batch.batch_size)
    return out


def commit(view: StepView, batch, decided: Decided, plan: StepPlan, window: StepWindow, target_out,
           on_publish) -> GenerationBatchResult:
    """Keep the accepted path's K/V, extend the draft's context, hand the scheduler its tokens and a new logits
    output (the verify's, with the verdict's gathered logits, the committed tokens' logprobs and no hidden
    states); the target's own output object is left as the pass returned it."""
    bs, n = window.slots.shape
    verdict = decided.verdict
    draft_ids = window.plan.write_ids(view.draft_kv).view(bs, n)                # the draft's slots of the window
    committed = commit_step(verdict, window.slots, draft_ids, plan.prefix_lens, view.req_to_token,
                            batch.req_pool_indices, backend=view.kernels)
    if on_publish is not None:
        on_publish(committed.new_seq_lens)
    hidden = target_out.logits_output.hidden_states
    if hidden is None:
        raise RuntimeError("DDTREE verify returned no target hidden states for the draft's context")
    view.append_draft_context(
        target_hidden=hidden.index_select(0, committed.hidden_rows.reshape(-1)),   # [bs * (L+1), H_aux]
        cache_loc=committed.draft_slots.reshape(-1), cache_loc_2d=committed.draft_slots,
        positions=committed.positions.reshape(-1), commit_lens=committed.commit_lens)
    logprobs = committed_logprobs(batch, decided.logits, committed) if batch.return_logprob else {}
    logits_output = dataclasses.replace(target_out.logits_output, next_token_logits=decided.logits,
                                        hidden_states=None, **logprobs)
    return GenerationBatchResult(
        logits_output=logits_output, next_token_ids=committed.out_tokens.reshape(-1),
        accept_lens=committed.commit_lens, can_run_cuda_graph=target_out.can_run_cuda_graph,
        next_draft_input=view.next_draft_input(bonus_tokens=verdict.bonus, new_seq_lens=committed.new_seq_lens),
        speculative_num_draft_tokens=view.block, new_seq_lens=committed.new_seq_lens,
        routed_experts_output=target_out.routed_experts_output,
        indexer_topk_output=target_out.indexer_topk_output)
