"""DDTreeWorker: DDTree speculative decoding inside SGLang 0.5.23. This module imports SGLang at its
top: ddtree.sglang.worker.make_worker_class imports it when the plugin registers DDTREE.

A subclass of 0.5.23's DFlashWorkerV2; no file of SGLang is patched. Prefill and idle steps are
the parent's (the target's prefill, its hidden states into the draft's KV, the first token from
SGLang's own sampler). A decode step is this module's, one method per stage:

  _ddtree_window      the request's N reserved KV slots this step writes, and SGLang's plan of them
  _ddtree_draft       the DFlash draft over its own block (bonus token + mask tokens, positions
                      prefix .. prefix + block - 1) in the draft's CUDA graph when one fits; the
                      DraftCandidateHead, folded into that graph, turns the hidden states at
                      depths 1..L into the top-K candidates per depth (TP: per-shard top-K and
                      log-normaliser, one all-gather)
  _ddtree_tree        build_tree_from_candidates -> DraftTree of width N = budget + 1 (with a budget / cap
                      schedule, the step's: settings.WidthSchedule.at(running batch size), over the first
                      K(cap) candidates)
  _ddtree_grammar     (a batch with grammars only) each constrained request's row rebuilt on the host: the
                      budget best paths its grammar allows, and the bitmask of every node (grammar.py)
  _ddtree_verify_batch  the target's TARGET_VERIFY batch of N tokens per request: the tree's
                      tokens at positions prefix + depth, the FULL_MASK custom mask (each node sees
                      the prefix, its ancestors and itself), K/V written to the request's reserved
                      window req_to_token[prefix : prefix + N]
  _ddtree_verify      that one pass (CUDA graphs captured at width N; a schedule's narrower widths have
                      their own attention backend and graphs, swapped in around the pass: widths.py)
  _ddtree_verdict     verdict.py: NONE's processing at every node (penalties with its own path, logit
                      bias, the grammar's mask, custom logit processors), the target's token at every
                      node (argmax, seeded or sampled), rank 0's for every rank, the walk from the root
                      -> Verdict; the root and the accepted draft tokens fed to SGLang's penalizers
  _ddtree_commit      the window permuted so the accepted path's slots come first (page size 1:
                      no K/V moves), the draft's context extended with the target hidden states of
                      the path; tokens [bs, block] for the scheduler (stride = block size, at most
                      L + 1 = block tokens a step), commit lengths, the next root

SGLANG_DDTREE_PROFILE_STEPS=N times each stage (profile.py; off by default, a diagnostics mode
that synchronises the device after every stage). SGLANG_DDTREE_SYNC_CHECK=warn|error runs each step under
torch's CUDA sync debug mode (sync_check.py). Under the overlap scheduler (allowed with
SGLANG_DDTREE_OVERLAP=1 until the GPU test bed has shown it lossless) the step reads host lengths only from
the scheduler's reservation (nxt_kv_lens_cpu), as DFlashWorkerV2 does.

Sizing (see settings.py): SGLang's speculative_num_draft_tokens is N = budget + 1 on a DDTREE
server; DFlashWorkerV2.__init__ takes that as its block size, so the worker restores the draft's
own block (SGLANG_DDTREE_BLOCK_SIZE) before any graph is captured, and the spec class answers
the block for the draft runner's graphs and N for the target's.

Refused at start-up (settings.refusals), and again here where only the loaded models tell:
DFlash2 selector, LiLiCorr and Domino drafts, hybrid (mamba) and sliding-window targets,
quantized or added-vocabulary LM heads. Per request (requests.py): grammars, custom logit processors, logprobs,
penalties and min_new_tokens are served (penalties and min_new_tokens not under the overlap scheduler).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.model_runner import SamplingPrewarmResult
from sglang.srt.model_executor.forward_batch_info import (CaptureHiddenMode, ForwardBatch, ForwardMode,
                                                          enable_num_token_non_padded)
from sglang.srt.runtime_context import get_exec, get_parallel, get_schedule
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import is_dense_head_weight
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _resolve_dflash_embedding_module
from sglang.srt.speculative.draft_worker_common import build_block_pos_offsets, make_draft_block_spec_info
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import draft_tp_context

from ddtree.sglang.grammar import GrammarStep, constrain_step
from ddtree.sglang.glue import commit_step, verify_mask, window_slots
from ddtree.sglang.head import DraftCandidateHead, HeadShard
from ddtree.sglang.profile import OFF, StepProfiler
from ddtree.sglang.sync_check import SyncCheck
from ddtree.settings import DDTreeConfigError
from ddtree.sglang.server_env import from_env, resolved_block, schedule_from_env
from ddtree.sglang import switches
from ddtree.sglang.step_dump import Diagnostics, StepDump, announce, leak_siblings
from ddtree.sglang.verdict import VerdictSetup, committed_logprobs, decide
from ddtree.sglang.widths import TargetWidths
from ddtree.tree import build_tree_from_candidates, candidate_count
from ddtree.types import Candidates, DraftTree, SamplingParams
from ddtree.verify import node_targets

logger = logging.getLogger("ddtree.sglang.worker")   # the name it had before the move


@dataclass
class StepWindow:
    """The KV slots of one decode step."""

    slots: torch.Tensor   # int64 [bs, N]  req_to_token[r, prefix : prefix + N] (virtual ids)
    plan: object          # SGLang KVLocPlan over slots (the draft writes its first `block` columns)


class DDTreeWorker(DFlashWorkerV2):
    """DFlash draft + DDTree: a tree of the budget best draft paths verified in one target pass."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        self._ddtree = from_env()
        self._ddtree_eager_seen: set[tuple[str, int]] = set()   # (stage, batch size) said to have run eagerly
        block = resolved_block(self._ddtree)
        super().__init__(server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port,
                         target_worker=target_worker)
        self._ddtree_keep_draft_block(block)
        problem = self._ddtree_unsupported()
        if problem:
            raise DDTreeConfigError(problem)
        self._ddtree_head = DraftCandidateHead(self._ddtree_head_shard(), self._ddtree_k(), block, max_bs=0)
        read = switches.read()                                                    # every SGLANG_DDTREE_* once
        self._ddtree_prof = StepProfiler.from_switches(read, torch.cuda.synchronize) or OFF
        self._ddtree_sync = SyncCheck.from_switches(read)                         # None unless diagnosing
        self._ddtree_schedule = schedule_from_env()
        self._ddtree_widths: TargetWidths | None = None                          # built in init_cuda_graphs
        self._ddtree_prewarm_trees()
        self._ddtree_diag = Diagnostics.from_switches(read)                       # test-bed diagnostics
        announce(self._ddtree_diag)
        self._ddtree_dump = (StepDump(self._ddtree_diag.dump_dir, self._ddtree_diag.dump_steps)
                             if self._ddtree_diag.dump_dir is not None else None)
        self._ddtree_verdict_setup = VerdictSetup(                                # the parent set these up
            logits_processor=self._target_logits_processor, can_skip_logits=self._can_skip_verify_logits,
            tp_sync=self._tp_sync, stale_penalties=self._ddtree_diag.fault == "stale-penalties")

    def _ddtree_max_running(self) -> int:
        """The most requests a step can run. Read from the server's settings: SGLang 0.5.23 sets
        ModelRunner.max_running_requests only in alloc_memory_pool, which has not run on the target when this
        worker is built (AttributeError at start-up on the H200, 2026-12-03); the decode graphs' largest batch
        when no limit is set."""
        limit = get_schedule().max_running_requests
        if limit:
            return int(limit)
        return max(1, max(get_exec().graph.cuda_graph_config.decode.bs or [1]))

    def init_cuda_graphs(self):
        """The draft's graphs (DFlashWorkerV2's), then a schedule's narrower verify widths: they need the target's
        attention backend and decode graph runner, which SGLang 0.5.23 builds after this worker's __init__
        (Scheduler.init_model_worker: draft worker, memory pools, attention backends, then the target's graphs
        before the draft's). Built in __init__ they met no graph runner (AttributeError on the H200, 2026-12-03)."""
        super().init_cuda_graphs()
        self._ddtree_widths = self._ddtree_target_widths()

    def _ddtree_target_widths(self) -> TargetWidths | None:
        """A schedule's narrower verify widths: the target's attention backend and graphs for each (widths.py)."""
        if len(self._ddtree_schedule.widths) < 2:
            return None
        target = self.target_worker.model_runner
        widths = TargetWidths(target, self._ddtree_schedule, self._ddtree.verify_tokens, self._ddtree_max_running())
        logger.info("DDTREE %s: %s", self._ddtree_schedule, widths.memory_report())
        return widths

    def _ddtree_prewarm_trees(self) -> None:
        """Build one tree for every (budget, cap) the schedule gives a running batch, at start-up: the tree
        kernel's Triton build (2.5 s on the H200) and its pair tables' copy to the device happen here, not in the
        first served step (seen on the H200, 2026-12-02: the sync check flagged that copy in the first step)."""
        vocab, depth = int(self.model_runner.model_config.vocab_size), self.block_size - 1
        max_bs = self._ddtree_max_running()
        for budget, cap in sorted({self._ddtree_schedule.at(b) for b in range(1, max_bs + 1)}):
            k = candidate_count(cap, budget, vocab)
            cand = Candidates(logp=torch.zeros((1, depth, k), dtype=torch.float32, device=self.device),   # [1, L, K]
                              tokens=torch.zeros((1, depth, k), dtype=torch.int64, device=self.device))
            build_tree_from_candidates(cand, torch.zeros(1, dtype=torch.int64, device=self.device), budget)

    # --- set-up -------------------------------------------------------------------------

    def _ddtree_keep_draft_block(self, block: int) -> None:
        """Undo DFlashWorkerV2.__init__'s block = speculative_num_draft_tokens (= budget + 1 here)."""
        self.block_size = block
        self.speculative_num_draft_tokens = block
        self.draft_model.set_block_size(block)
        self._block_pos_offsets = build_block_pos_offsets(length=block, device=self.device)
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=block, device=self.device)

    def _ddtree_unsupported(self) -> str | None:
        target = "the target model"
        checks = (
            (self.selector is not None, "a DFlash2 selector draft (candidate lattice) is not a DDTREE draft"),
            (self.lilicorr is not None, "a LiLiCorr draft head is not a DDTREE draft"),
            (self._is_domino, "a Domino draft is not a DDTREE draft"),
            (self.use_compact_draft_cache, "--speculative-draft-window-size (compact draft cache)"),
            (self._need_mamba_verify_commit, f"{target} has mamba state (hybrid): its verify commit is a chain"),
            (self.page_size != 1, f"--page-size={self.page_size}: use --page-size 1"),
            ((self.model_runner.sliding_window_size or -1) > 0,
             f"{target} uses sliding-window attention, which the tree mask path does not cover"),
        )
        for failed, why in checks:
            if failed:
                return f"DDTREE cannot serve this configuration: {why}; serve --speculative-algorithm DFLASH"
        return None

    def _ddtree_head_shard(self) -> HeadShard:
        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        weight = getattr(lm_head, "weight", None)
        if weight is None or not is_dense_head_weight(weight):
            raise DDTreeConfigError("DDTREE needs the target's LM head as a dense weight (a quantized LM head "
                                    "cannot score draft candidates); serve --speculative-algorithm DFLASH")
        tp = get_parallel().tp_group
        shard = getattr(lm_head, "shard_indices", None)
        if shard is None:
            num_org = min(int(weight.shape[0]), int(self.model_runner.model_config.vocab_size))
            return HeadShard(weight=weight, num_org=num_org, vocab_start=0)
        if int(shard.num_added_elements) != 0:
            raise DDTreeConfigError("DDTREE does not score added-vocabulary tokens (LoRA extra vocab) in the "
                                    "draft head; serve --speculative-algorithm DFLASH")
        world = int(tp.world_size)
        return HeadShard(weight=weight, num_org=int(shard.num_org_elements),
                         vocab_start=int(shard.org_vocab_start_index), world=world,
                         gather=tp.all_gather_into_tensor if world > 1 else None)

    def _ddtree_k(self) -> int:
        vocab = int(self.model_runner.model_config.vocab_size)
        return candidate_count(self._ddtree.topk_cap, self._ddtree.budget, vocab)

    def _maybe_build_draft_sampler(self):
        """DFlashWorkerV2.init_cuda_graphs calls this right before the draft's graphs are captured
        and folds what it returns into them: the candidate head instead of DFlash's greedy argmax."""
        self._ddtree_head.reserve(max(get_exec().graph.cuda_graph_config.decode.bs))
        return self._ddtree_head

    def prewarm_sampling(self):
        """Rehearse this worker's sampling verify (every node of every tree at once: [bs * N, V]
        probabilities) at start-up, so its memory peak is reserved; DFlash's own rehearsal (its
        chain sampling kernel) does not apply here."""
        n, vocab = self._ddtree.verify_tokens, int(self.model_runner.model_config.vocab_size)
        bs = max(1, min(int(self.model_runner.max_running_requests or 1),
                        self.model_runner.max_decode_logits_rows() // n))
        logits = torch.zeros((bs, n, vocab), dtype=torch.float32, device=self.device)       # [bs, N, V]
        params = SamplingParams(temperature=torch.ones(bs, device=self.device), top_k=None,
                                top_p=torch.full((bs,), 0.95, device=self.device), min_p=None, all_greedy=False)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        node_targets(logits, params, generator=None)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        size = logits.numel() * logits.element_size()
        result = SamplingPrewarmResult(sampling_input_bytes=size, sampling_headroom_bytes=peak + size)
        self.model_runner.sampling_prewarm_result = result
        logger.info("DDTREE sampling pre-warm: bs=%d x %d nodes, peak=%d B headroom=%d B", bs, n, peak,
                    result.sampling_headroom_bytes)
        return result

    # --- the decode step ----------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            return super().forward_batch_generation(batch, on_publish=on_publish, grammar_barrier=grammar_barrier,
                                                    pp_proxy_tensors=pp_proxy_tensors)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE decode expected the DFlashDraftInputV2 its prefill left on the batch, "
                               f"got {type(draft_input).__name__}")
        # under the overlap scheduler seq_lens comes from the previous step, possibly made on another stream
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        checked = self._ddtree_sync is not None and not batch.has_grammar and not (
            batch.sampling_info is not None and batch.sampling_info.has_custom_logit_processor)
        with self._ddtree_sync.step() if checked else contextlib.nullcontext():
            return self._ddtree_decode(batch, draft_input, on_publish, grammar_barrier)

    def _ddtree_decode(self, batch, draft_input, on_publish, grammar_barrier):
        prefix_lens = batch.seq_lens                                               # int64 [bs] committed
        bs = int(prefix_lens.shape[0])                                             # a shape: no device wait
        budget, cap = self._ddtree_schedule.at(bs)                                 # this step's tree
        prof = self._ddtree_prof                                                   # OFF unless profiling
        prof.begin(bs)
        with prof.stage("window"):
            window = self._ddtree_window(batch, draft_input, prefix_lens, budget + 1)
        with prof.stage("draft"):
            cand = self._ddtree_draft(batch, draft_input, prefix_lens, window)
        with prof.stage("tree"):
            cand = self._ddtree_fewer(cand, budget, cap)                           # [bs, L, K(cap)]
            tree = self._ddtree_tree(cand, draft_input.bonus_tokens.view(-1), budget)
        grammar = None
        if batch.has_grammar:
            with prof.stage("grammar"):
                grammar = self._ddtree_grammar(batch, cand, tree, budget, grammar_barrier)
                tree = grammar.tree if grammar is not None else tree
        with self._ddtree_widths.active(budget + 1) if self._ddtree_widths else contextlib.nullcontext():
            with prof.stage("verify_inputs"):
                verify_batch = self._ddtree_verify_batch(batch, draft_input, tree, prefix_lens, window)
            with prof.stage("verify"):
                target_out = self._ddtree_verify(verify_batch)
        if self._ddtree_dump is not None and self._ddtree_dump.wanted():
            self._ddtree_write_dump(batch, tree, target_out.logits_output.next_token_logits, prefix_lens)
        with prof.stage("verdict"):
            verdict = self._ddtree_verdict(batch, tree, target_out.logits_output, prefix_lens,
                                           grammar.mask if grammar is not None else None)
        with prof.stage("commit"):
            result = self._ddtree_commit(batch, verdict, prefix_lens, window, target_out, on_publish)
        prof.end()
        return result

    def _ddtree_window(self, batch, draft_input, prefix_lens: torch.Tensor, n: int) -> StepWindow:
        """The step's N reserved slots per request and their KV plan (read extent N); N = the step's budget + 1
        (SGLang reserved the widest step's window)."""
        slots = window_slots(self.model_runner.req_to_token_pool.req_to_token, batch.req_pool_indices,
                             prefix_lens, n)                                      # [bs, N]
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu
        plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens, seq_lens_cpu=seq_lens_cpu,
            write_virtual=slots.reshape(-1), read_extent=n)
        return StepWindow(slots=slots, plan=plan)

    def _ddtree_host_lens(self, batch, draft_input, extra: int) -> tuple[torch.Tensor, int]:
        """Host upper bounds of the lengths a pass reads (no device sync): committed + extra, or
        the reserved lengths when the scheduler keeps no committed ones on the host."""
        if batch.seq_lens_cpu is not None:
            lens = batch.seq_lens_cpu + extra
        else:
            lens = draft_input.nxt_kv_lens_cpu.clone()
        return lens, int(lens.sum())

    def _ddtree_noise_embeddings(self, block_ids: torch.Tensor) -> torch.Tensor:
        """block_ids int64 [bs, block] -> input embeddings [bs * block, H] (the target's table)."""
        if self._full_embed_gpu is not None:
            emb = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            target_model = self.target_worker.model_runner.model
            emb = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))(block_ids)
        if self._noise_embed_scale != 1.0:
            emb = emb * self._noise_embed_scale
        return emb.view(-1, emb.shape[-1])

    def _ddtree_draft(self, batch, draft_input, prefix_lens: torch.Tensor, window: StepWindow):
        """One DFlash draft pass over its block -> Candidates [bs, L, K]."""
        bs, block = prefix_lens.shape[0], self.block_size
        block_ids = torch.full((bs, block), int(self._mask_token_id), dtype=torch.int64, device=self.device)
        block_ids[:, 0] = draft_input.bonus_tokens.view(-1)                      # slot 0: the bonus token
        positions = prefix_lens[:, None] + self._block_pos_offsets               # [bs, block]
        seq_lens_cpu, seq_lens_sum = self._ddtree_host_lens(batch, draft_input, block)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.reshape(-1),
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            out_cache_loc=window.slots[:, :block].reshape(-1), seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu, positions=positions.reshape(-1),
            input_embeds=self._ddtree_noise_embeddings(block_ids), spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info, capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(torch.full((), bs * block, dtype=torch.int32, device=self.device)
                                  if enable_num_token_non_padded() else None),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph)
        window.plan.bind(forward_batch, self.draft_model_runner.kv_index_translator, cols=slice(0, block))
        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            out = self.draft_model_runner.forward(forward_batch)
            if self._draft_sampler is not None and out.can_run_graph:
                return self._ddtree_head.captured(bs)                            # the graph ran the head
            if self._draft_sampler is not None:
                self._ddtree_note_eager("draft", bs)
            hidden = out.logits_output.hidden_states
            if hidden is None:
                raise RuntimeError("the DFlash draft returned no hidden states")
            return self._ddtree_head.compute(hidden[: bs * block])

    def _ddtree_tree(self, cand: Candidates, roots: torch.Tensor, budget: int) -> DraftTree:
        return build_tree_from_candidates(cand, roots, budget)

    def _ddtree_fewer(self, cand: Candidates, budget: int, cap: int) -> Candidates:
        """The step's K(cap) candidates per depth: the head keeps the widest step's K, best first, so a narrower
        step's are a prefix."""
        k = candidate_count(cap, budget, int(self.model_runner.model_config.vocab_size))
        if k >= cand.logp.shape[-1]:
            return cand
        return Candidates(logp=cand.logp[..., :k].contiguous(), tokens=cand.tokens[..., :k].contiguous())

    def _ddtree_grammar(self, batch, cand, tree: DraftTree, budget: int, barrier) -> GrammarStep | None:
        """The rows of requests with a grammar rebuilt on the host under it (grammar.py), and the step's
        bitmask; the prefill's leftover mask on the batch's sampling info is dropped (it is per request,
        not per node), as SGLang's DFLASH verify drops it."""
        step = constrain_step(batch.reqs, cand, tree, budget, int(batch.sampling_info.vocab_size), barrier)
        batch.sampling_info.grammar_mask = None
        return step

    def _ddtree_verify_batch(self, batch, draft_input, tree: DraftTree, prefix_lens: torch.Tensor,
                             window: StepWindow):
        """The target's TARGET_VERIFY ForwardBatch over the N tree nodes of every request (custom mask)."""
        bs, n = tree.tokens.shape
        committed_cpu, committed_sum = self._ddtree_host_lens(batch, draft_input, 0)   # host upper bounds
        if self._ddtree_diag.fault == "sibling":                                    # a deliberate fault (tests)
            tree = leak_siblings(tree)
        mask = verify_mask(tree, prefix_lens, total=n * (committed_sum + bs * n),     # sum_b N * (prefix_b + N)
                           max_prefix=int(committed_cpu.max()))
        verify_input = DFlashVerifyInput(
            draft_token=tree.tokens.reshape(-1), positions=mask.positions.reshape(-1),
            draft_token_num=n, custom_mask=mask.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL, kv_loc_plan=window.plan)
        batch.out_cache_loc = window.slots.reshape(-1)
        saved = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu, batch.seq_lens_sum = self._ddtree_host_lens(batch, draft_input, n)
        try:
            forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = saved
        return forward_batch

    def _ddtree_write_dump(self, batch, tree: DraftTree, logits: torch.Tensor, prefix_lens: torch.Tensor) -> None:
        """Diagnostics (step_dump.py): the step's trees, verify logits [bs * N, V] and each request's prefix KV."""
        runner = self.target_worker.model_runner
        if runner.kv_index_translator.needs_read_translate:                        # a property
            raise RuntimeError("SGLANG_DDTREE_DUMP reads the KV pool by req_to_token ids: this pool translates "
                               "them (sliding window or a moving pool); unset it")
        rows = runner.req_to_token_pool.req_to_token[batch.req_pool_indices]            # [bs, W]
        self._ddtree_dump.write(batch.reqs, tree, logits, prefix_lens, rows, runner.token_to_kv_pool)

    def _ddtree_verify(self, forward_batch):
        """One target pass over the tree nodes (the captured graph of width N when one fits)."""
        out = self.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch,
                                                          is_verify=True, skip_attn_backend_init=True)
        if self.target_worker.model_runner.decode_cuda_graph_runner is not None and not out.can_run_cuda_graph:
            self._ddtree_note_eager("verify", forward_batch.batch_size)
        return out

    def _ddtree_note_eager(self, stage: str, bs: int) -> None:
        """Graphs are on but this pass ran eagerly: said once per stage and batch size."""
        if (stage, bs) not in self._ddtree_eager_seen:
            self._ddtree_eager_seen.add((stage, bs))
            logger.warning("DDTREE %s ran eagerly for batch size %d (no captured CUDA graph fits it)", stage, bs)

    def _ddtree_verdict(self, batch, tree: DraftTree, logits_output, prefix_lens: torch.Tensor,
                        grammar_mask=None):
        """The verdict stage (verdict.py): processing, the target's token at every node, the walk, penalty feeding."""
        return decide(self._ddtree_verdict_setup, batch, tree, logits_output, prefix_lens, grammar_mask)

    def _ddtree_commit(self, batch, verdict, prefix_lens: torch.Tensor, window: StepWindow, target_out,
                       on_publish):
        """Keep the accepted path's K/V, extend the draft's context, hand the scheduler its tokens."""
        bs, n = window.slots.shape
        draft_ids = self._draft_write_ids(window.plan).view(bs, n)               # the draft's slots of the window
        done = commit_step(verdict, window.slots, draft_ids, prefix_lens,
                           self.model_runner.req_to_token_pool.req_to_token, batch.req_pool_indices)
        if on_publish is not None:
            on_publish(done.new_seq_lens)
        logits_output = target_out.logits_output
        if batch.return_logprob:
            committed_logprobs(batch, logits_output, done)
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify returned no target hidden states for the draft's context")
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.index_select(0, done.hidden_rows.reshape(-1)),   # [bs * (L+1), H_aux]
            cache_loc=done.draft_slots.reshape(-1), cache_loc_2d=done.draft_slots,
            positions=done.positions.reshape(-1), commit_lens=done.commit_lens)
        logits_output.hidden_states = None
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=done.out_tokens.reshape(-1),
            accept_lens=done.commit_lens, can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(bonus_tokens=verdict.bonus,
                                                                new_seq_lens=done.new_seq_lens),
            speculative_num_draft_tokens=self.block_size, new_seq_lens=done.new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output)
