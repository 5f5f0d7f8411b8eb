"""DDTreeWorker: DDTree speculative decoding inside SGLang 0.5.23. This module imports SGLang at its
top: ddtree.sglang.worker.make_worker_class imports it when the plugin registers DDTREE.

A subclass of 0.5.23's DFlashWorkerV2; no file of SGLang is patched. Prefill and idle steps are the parent's (the
target's prefill, its hidden states into the draft's KV, the first token from SGLang's own sampler). A decode
step is this module's: the stages of decode_step.py (window, draft, tree, grammar, verify, verdict, commit) run in
order over one StepPlan, each taking what it reads (the StepView, step/view.py, built once after the graphs: no
stage reads the worker) and returning what it makes; the verdict is verdict.py's. Start-up jobs are
worker_setup.py's; what the worker adds to its parent is one DDTreeParts, set in __init__. The test bed's
deliberate faults are subclasses (diagnostics/faults.py) that override one of the three hooks below, step_tree,
verify_tree and penalty_paths; ddtree.sglang.worker.make_worker_class picks one at start-up from SGLANG_DDTREE_FAULT.

Sizing (see server_env.py): SGLang's speculative_num_draft_tokens is N = budget + 1 on a DDTREE server;
DFlashWorkerV2.__init__ takes that as its block size, so the worker restores the draft's own block
(SGLANG_DDTREE_BLOCK_SIZE) before any graph is captured, and the spec class answers the block for the draft
runner's graphs and N for the target's.

SGLANG_DDTREE_PROFILE_STEPS=N times each stage (profile.py; a diagnostics mode that synchronises the device after
every stage). SGLANG_DDTREE_SYNC_CHECK=warn|error runs each step under torch's CUDA sync debug mode
(sync_check.py). Refused at start-up (refusals.py), and again here where only the loaded models tell: DFlash2
selector, LiLiCorr and Domino drafts, hybrid (mamba) and sliding-window targets, quantized or added-vocabulary LM
heads. Per request (requests.py): grammars, custom logit processors, logprobs, penalties and min_new_tokens are
served (penalties and min_new_tokens not under the overlap scheduler).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.runtime_context import get_exec, get_observability, get_parallel
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from ddtree.settings import DDTreeConfigError, DDTreeSettings, WidthSchedule
from ddtree import switches
from ddtree.backend import resolve_backend
from ddtree.sglang.step.decode_step import (EagerPasses, commit, constrain_to_grammars, draft_candidates,
                                            hand_to_scheduler, narrow_candidates, plan_step, reserve_window,
                                            run_verify, verify_forward_batch)
from ddtree.sglang.step.head import DraftCandidateHead
from ddtree.sglang.diagnostics.profile import OFF, StepProfiler
from ddtree.sglang.setup.server_env import resolved_block, schedule_of, settings_of
from ddtree.sglang.diagnostics.step_dump import Diagnostics, StepDump, announce, dump_step
from ddtree.sglang.diagnostics.sync_check import SyncCheck
from ddtree.sglang.step.verdict import VerdictSetup, decide, step_paths
from ddtree.sglang.step.view import StepView
from ddtree.sglang.setup.widths import TargetWidths
from ddtree.sglang.policy.policy_metrics import PolicyMetrics
from ddtree.sglang.policy.step_policy import StepPolicy
from ddtree.sglang.setup.worker_setup import (head_shard, keep_draft_block, prewarm_trees, rehearse_sampling,
                                             step_costs, step_policy, step_view, target_widths, unsupported_reason)
from ddtree.tree import build_tree_from_candidates, candidate_count, root_only_tree
from ddtree.types import DraftTree


@dataclass
class DDTreeParts:
    """What the worker adds to DFlashWorkerV2 (its parent's own fields stay where SGLang reads them)."""

    settings: DDTreeSettings            # the widest step's budget and cap (N = budget + 1)
    schedule: WidthSchedule             # (budget, cap) by running batch size
    vocab: int                          # the target's vocabulary (unpadded)
    head: DraftCandidateHead            # draft hidden states -> top-K candidates per depth (in the draft's graphs)
    verdict_setup: VerdictSetup
    profiler: StepProfiler              # OFF unless SGLANG_DDTREE_PROFILE_STEPS
    sync_check: SyncCheck | None        # None unless SGLANG_DDTREE_SYNC_CHECK
    diagnostics: Diagnostics            # test-bed switches (dump; the fault is the worker's class)
    dump: StepDump | None
    view: StepView | None = None        # what the stages read, built in init_cuda_graphs
    widths: TargetWidths | None = None  # a schedule's narrower verify widths, built in init_cuda_graphs
    cost_table: Path | None = None      # SGLANG_DDTREE_COST_TABLE: a sweep's step costs for `auto`
    cost_learn: bool = True             # SGLANG_DDTREE_COST_LEARN: the table corrected by the measured steps
    policy: StepPolicy | None = None    # `auto`: the width of each step (step_policy.py), built in init_cuda_graphs
    metrics: PolicyMetrics | None = None  # its numbers on /metrics (rank 0, --enable-metrics)
    eager: EagerPasses = field(default_factory=EagerPasses)
    kernels: str = "torch"              # DDTREE_BACKEND resolved once: every stage's kernel backend


class DDTreeWorker(DFlashWorkerV2):
    """DFlash draft + DDTree: a tree of the budget best draft paths verified in one target pass."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        read = switches.read()                                        # every DDTREE_* / SGLANG_DDTREE_* once
        settings = settings_of(read)
        block = resolved_block(settings)
        super().__init__(server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port,
                         target_worker=target_worker)
        keep_draft_block(self, block)
        problem = unsupported_reason(self)
        if problem:
            raise DDTreeConfigError(problem)
        vocab = int(self.model_runner.model_config.vocab_size)
        diagnostics = Diagnostics.from_switches(read)
        kernels = resolve_backend(read.backend, torch.device(self.device))    # once: no step reads the environment
        self.ddtree = DDTreeParts(
            settings=settings, schedule=schedule_of(read), vocab=vocab,
            head=DraftCandidateHead(head_shard(self), candidate_count(settings.topk_cap, settings.budget, vocab),
                                    block, max_bs=0),
            verdict_setup=VerdictSetup(                                           # the parent set these up
                logits_processor=self._target_logits_processor, can_skip_logits=self._can_skip_verify_logits,
                tp_sync=self._tp_sync, penalty_paths=self.penalty_paths, kernels=kernels),
            profiler=StepProfiler.from_switches(read, torch.cuda.synchronize) or OFF,
            sync_check=SyncCheck.from_switches(read), diagnostics=diagnostics,
            dump=StepDump(diagnostics.dump_dir, diagnostics.dump_steps) if diagnostics.dump_dir is not None else None,
            cost_table=read.cost_table, cost_learn=read.cost_learn, kernels=kernels)
        prewarm_trees(self.ddtree.schedule, vocab, block - 1, self.device)
        announce(diagnostics)

    # --- SGLang's hooks ----------------------------------------------------------------------------------------

    def init_cuda_graphs(self):
        """The draft's graphs (DFlashWorkerV2's), then a schedule's narrower verify widths, with `auto` the step
        costs and the width policy, and last the stages' view (worker_setup)."""
        super().init_cuda_graphs()
        parts = self.ddtree
        parts.view = step_view(self, parts.kernels)
        parts.widths = target_widths(self, parts.schedule, parts.settings.verify_tokens)
        if parts.schedule.auto:
            table = step_costs(self, parts.widths, parts.cost_table)
            parts.policy = step_policy(self, parts.schedule, table, parts.cost_learn, parts.kernels)
            parts.metrics = PolicyMetrics.create(table, get_parallel().tp_group.rank_in_group,
                                                 bool(get_observability().enable_metrics))

    def _maybe_build_draft_sampler(self):
        """DFlashWorkerV2.init_cuda_graphs calls this right before the draft's graphs are captured and folds what
        it returns into them: the candidate head instead of DFlash's greedy argmax."""
        self.ddtree.head.reserve(max(get_exec().graph.cuda_graph_config.decode.bs))
        return self.ddtree.head

    def prewarm_sampling(self):
        return rehearse_sampling(self.model_runner, self.ddtree.settings.verify_tokens, self.device)

    # --- the hooks a test-bed fault overrides (diagnostics/faults.py) ---------------------------------------------

    def step_tree(self, tree: DraftTree) -> DraftTree:
        """The tree a speculative step verifies and decides on: the one just built."""
        return tree

    def verify_tree(self, tree: DraftTree) -> DraftTree:
        """The tree the verify pass attends over: the step's own."""
        return tree

    def penalty_paths(self, tree: DraftTree) -> DraftTree:
        """The tree as the verdict's penalties count it: each node's own path."""
        return step_paths(tree)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            if self.ddtree.policy is not None:
                self.ddtree.policy.interrupted()
            return super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier,
                                                    pp_proxy_tensors=pp_proxy_tensors)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE decode expected the DFlashDraftInputV2 its prefill left on the batch, "
                               f"got {type(draft_input).__name__}")
        # under the overlap scheduler seq_lens comes from the previous step, possibly made on another stream
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        watched = self.ddtree.sync_check is not None and not batch.has_grammar and not (
            batch.sampling_info is not None and batch.sampling_info.has_custom_logit_processor)
        with self.ddtree.sync_check.step() if watched else contextlib.nullcontext():
            return self._decode(batch, draft_input, on_publish, grammar_barrier)

    # --- the decode step ---------------------------------------------------------------------------------------

    def _decode(self, batch, draft_input, on_publish, grammar_barrier) -> GenerationBatchResult:
        parts, view = self.ddtree, self.ddtree.view
        if view is None:
            raise RuntimeError("DDTREE decode before init_cuda_graphs built the stages' view")
        plan = plan_step(batch, parts.schedule, parts.policy)                     # bs, this step's budget / cap
        if parts.metrics is not None:
            parts.metrics.maybe_publish(parts.policy)
        prof = parts.profiler
        prof.begin(plan.bs)
        with prof.stage("window"):
            window = reserve_window(view, batch, draft_input, plan)               # slots [bs, N]
        roots = draft_input.bonus_tokens.view(-1)                                # [bs]
        if plan.speculates:
            with prof.stage("draft"):
                widest = draft_candidates(view, batch, draft_input, plan, window, parts.head, parts.eager)
            with prof.stage("tree"):
                candidates = narrow_candidates(widest, plan, parts.vocab)          # [bs, L, K(cap)]
                tree = self.step_tree(build_tree_from_candidates(candidates, roots, plan.budget, view.kernels))
            if parts.policy is not None:
                with prof.stage("policy"):
                    parts.policy.observe(tree, widest, roots, plan.budget, plan.cap)
        else:                                                                     # the policy's no-speculation step
            tree = root_only_tree(roots, view.block - 1)                          # [bs, 1]
        grammar = None
        if batch.has_grammar:                                                     # never without speculation
            with prof.stage("grammar"):
                grammar = constrain_to_grammars(batch, candidates, tree, plan, grammar_barrier)
                tree = grammar.tree if grammar is not None else tree
        hand_to_scheduler(batch, window)
        with parts.widths.active(plan.width) if parts.widths else contextlib.nullcontext():
            with prof.stage("verify_inputs"):
                verify_batch = verify_forward_batch(view, batch, draft_input, self.verify_tree(tree), plan, window)
            with prof.stage("verify"):
                target_out = run_verify(view, verify_batch, parts.eager)
        if parts.dump is not None and parts.dump.wanted():
            dump_step(parts.dump, view.target_worker.model_runner, batch, tree,
                      target_out.logits_output.next_token_logits, plan.prefix_lens)
        with prof.stage("verdict"):
            decided = decide(parts.verdict_setup, batch, tree, target_out.logits_output, plan.prefix_lens,
                             grammar.mask if grammar is not None else None)
        if parts.policy is not None:
            with prof.stage("learn"):
                parts.policy.learn(tree, decided.verdict.accept_len)
        with prof.stage("commit"):
            result = commit(view, batch, decided, plan, window, target_out, on_publish)
        prof.end()
        return result
