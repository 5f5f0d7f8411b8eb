"""What a DDTREE worker does once, at start-up inside SGLang 0.5.23 (tree_worker.DDTreeWorker's set-up, one
function per job; `worker` is the DDTreeWorker after its parent DFlashWorkerV2's __init__):

  keep_draft_block      undo DFlashWorkerV2.__init__'s block = speculative_num_draft_tokens (= budget + 1 here)
  unsupported_reason    what only the loaded models tell DDTREE cannot serve (the rest is refused before start)
  head_shard            the target's LM head as the candidate head scores with it (TP shard, dense only)
  max_running           the most requests a step can run, from the settings SGLang fills before the worker
  prewarm_trees         one tree per (budget, cap) of the schedule: Triton builds and table copies happen here
  target_widths         a schedule's narrower verify widths (widths.py), after the target's graphs exist
  step_policy           with `auto`: the step costs (graph_timing: every captured graph timed, or the sweep's table)
                        and the width policy (step_policy.py), after every graph exists
  rehearse_sampling     the sampling verify's memory peak, so SGLang reserves it
  step_view             the decode stages' read-only view (step/view.py), after every graph exists
"""

from __future__ import annotations

import logging
import time

import torch
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.model_executor.model_runner import SamplingPrewarmResult
from sglang.srt.runtime_context import get_exec, get_parallel, get_schedule
from sglang.srt.speculative.dflash_utils import is_dense_head_weight
from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module
from sglang.srt.speculative.draft_worker_common import build_block_pos_offsets, make_draft_block_spec_info

from ddtree.settings import DDTreeConfigError, WidthSchedule
from ddtree.sglang.policy.graph_timing import CostTable, embedded_ids, shared_across_ranks, time_graphs
from ddtree.sglang.step.head import HeadShard
from ddtree.sglang.step.view import StepView
from ddtree.sglang.policy.step_policy import StepPolicy, step_policy_for
from ddtree.sglang.setup.widths import TargetWidths
from ddtree.tree import build_tree_from_candidates, candidate_count
from ddtree.types import Candidates, SamplingParams
from ddtree.verify import node_targets

logger = logging.getLogger(__name__)


def keep_draft_block(worker, block: int) -> None:
    worker.block_size = block
    worker.speculative_num_draft_tokens = block
    worker.draft_model.set_block_size(block)
    worker._block_pos_offsets = build_block_pos_offsets(length=block, device=worker.device)
    worker._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=block, device=worker.device)


def unsupported_reason(worker) -> str | None:
    target = "the target model"
    checks = (
        (worker.selector is not None, "a DFlash2 selector draft (candidate lattice) is not a DDTREE draft"),
        (worker.lilicorr is not None, "a LiLiCorr draft head is not a DDTREE draft"),
        (worker._is_domino, "a Domino draft is not a DDTREE draft"),
        (worker.use_compact_draft_cache, "--speculative-draft-window-size (compact draft cache)"),
        (worker._need_mamba_verify_commit, f"{target} has mamba state (hybrid): its verify commit is a chain"),
        (worker.page_size != 1, f"--page-size={worker.page_size}: use --page-size 1"),
        ((worker.model_runner.sliding_window_size or -1) > 0,
         f"{target} uses sliding-window attention, which the tree mask path does not cover"),
    )
    for failed, why in checks:
        if failed:
            return f"DDTREE cannot serve this configuration: {why}; serve --speculative-algorithm DFLASH"
    return None


def head_shard(worker) -> HeadShard:
    lm_head = unwrap_lora_layer(getattr(worker.target_worker.model_runner.model, "lm_head", None))
    weight = getattr(lm_head, "weight", None)
    if weight is None or not is_dense_head_weight(weight):
        raise DDTreeConfigError("DDTREE needs the target's LM head as a dense weight (a quantized LM head "
                                "cannot score draft candidates); serve --speculative-algorithm DFLASH")
    tp = get_parallel().tp_group
    shard = getattr(lm_head, "shard_indices", None)
    if shard is None:
        num_org = min(int(weight.shape[0]), int(worker.model_runner.model_config.vocab_size))
        return HeadShard(weight=weight, num_org=num_org, vocab_start=0)
    if int(shard.num_added_elements) != 0:
        raise DDTreeConfigError("DDTREE does not score added-vocabulary tokens (LoRA extra vocab) in the "
                                "draft head; serve --speculative-algorithm DFLASH")
    world = int(tp.world_size)
    return HeadShard(weight=weight, num_org=int(shard.num_org_elements),
                     vocab_start=int(shard.org_vocab_start_index), world=world,
                     gather=tp.all_gather_into_tensor if world > 1 else None)


def max_running() -> int:
    """Read from the server's settings: SGLang 0.5.23 sets ModelRunner.max_running_requests only in
    alloc_memory_pool, which has not run on the target when the worker is built (AttributeError at start-up on the
    H200, 2026-12-03); the decode graphs' largest batch when no limit is set."""
    limit = get_schedule().max_running_requests
    if limit:
        return int(limit)
    return max(1, max(get_exec().graph.cuda_graph_config.decode.bs or [1]))


def prewarm_trees(schedule: WidthSchedule, vocab: int, depth: int, device) -> None:
    """One tree for every (budget, cap) the schedule gives a running batch: the tree kernel's Triton build (2.5 s
    on the H200) and its pair tables' copy to the device happen here, not in the first served step (seen on the
    H200, 2026-12-02: the sync check flagged that copy in the first step)."""
    for budget, cap in sorted(schedule.pairs(max_running())):      # every tree a step may build (none builds none)
        k = candidate_count(cap, budget, vocab)
        cand = Candidates(logp=torch.zeros((1, depth, k), dtype=torch.float32, device=device),   # [1, L, K]
                          tokens=torch.zeros((1, depth, k), dtype=torch.int64, device=device))
        build_tree_from_candidates(cand, torch.zeros(1, dtype=torch.int64, device=device), budget)


def target_widths(worker, schedule: WidthSchedule, verify_tokens: int) -> TargetWidths | None:
    """A schedule's narrower verify widths: the target's attention backend and graphs for each. They need the
    target's decode graph runner, which SGLang 0.5.23 builds after the draft worker's __init__ (Scheduler.
    init_model_worker: draft worker, memory pools, attention backends, then the target's graphs before the
    draft's): the worker calls this from its init_cuda_graphs, after its parent's (AttributeError on the H200,
    2026-12-03, when built in __init__)."""
    if len(schedule.widths) < 2 and not schedule.auto:      # auto times its graphs through TargetWidths, even one
        return None
    widths = TargetWidths(worker.target_worker.model_runner, schedule, verify_tokens, max_running())
    logger.info("DDTREE %s: %s", schedule, widths.memory_report())
    return widths


def step_costs(worker, widths: TargetWidths | None, table_file) -> CostTable:
    """The step cost table of an `auto` server: the sweep's file when given, else every captured verify graph (each
    width's) and the draft's timed now, rank 0's shared with every rank; logged line by line."""
    if table_file is not None:
        table = CostTable.read(table_file)
    else:
        if widths is None or any(state.graph_runner is None for state in widths.states.values()):
            raise DDTreeConfigError("--speculative-ddtree-budget auto needs the step costs: with CUDA graphs off there "
                                    "are no graphs to time; turn CUDA graphs on or give a measured table in "
                                    "SGLANG_DDTREE_COST_TABLE")
        runners = {w: state.graph_runner for w, state in widths.states.items()}
        draft = getattr(worker.draft_model_runner, "decode_cuda_graph_runner", None)
        table = time_graphs(runners, draft, timing_tokens(worker))
        table = shared_across_ranks(table, get_parallel().tp_group, worker.device)
    for line in table.lines():
        logger.info(line)
    return table


def timing_tokens(worker) -> torch.Tensor:
    """The token ids [n] the verify graphs are timed with: those this rank's shard of the target's input embedding
    embeds (graph_timing.embedded_ids; a model without get_input_embeddings: every id of its vocabulary)."""
    runner = worker.target_worker.model_runner
    vocab = int(runner.model_config.vocab_size)
    get = getattr(runner.model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    weight = getattr(embedding, "weight", None)
    if weight is None:
        return torch.arange(vocab, dtype=torch.int64)
    shard = getattr(embedding, "shard_indices", None)
    if shard is None:
        return embedded_ids(weight, 0, min(vocab, int(weight.shape[0])))
    return embedded_ids(weight, int(shard.org_vocab_start_index), int(shard.num_org_elements))


def ratios_across_ranks():
    """Rank 0's measured cost ratios for every rank (measured_costs.MeasuredCosts.vector: a fixed-length list, NaN
    where nothing was measured), through the TP group's CPU group; None at TP 1 (nothing to share)."""
    tp = get_parallel().tp_group
    if int(tp.world_size) <= 1:
        return None

    def share(values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        torch.distributed.broadcast(tensor, src=tp.ranks[0], group=tp.cpu_group)
        return tensor.tolist()
    return share


def step_policy(worker, schedule: WidthSchedule, table: CostTable, learn_costs: bool = True,
                kernels: str | None = None) -> StepPolicy:
    """The width policy over the schedule's choices, priced by `table` corrected by the steps it measures unless
    learn_costs is off (SGLANG_DDTREE_COST_LEARN); lag 2 under the overlap scheduler, 1 without: step_policy.py says
    why."""
    overlapped = not get_schedule().disable_overlap_schedule
    policy = step_policy_for(schedule.choices(), schedule.chain, table.curve(), depth=worker.block_size - 1,
                             lag=2 if overlapped else 1, device=worker.device,
                             share=ratios_across_ranks(), learn_costs=learn_costs, kernels=kernels)
    logger.info("DDTREE width policy: %s, lag %d step(s)%s, priced by %s", ", ".join(o.name for o in policy.options),
                policy.lag, " (overlap scheduler)" if overlapped else "",
                "the table x the measured steps" if learn_costs else "the table alone (SGLANG_DDTREE_COST_LEARN=0)")
    if torch.device(worker.device).type == "cuda":
        capture_policy_graphs(policy, get_exec().graph.cuda_graph_config.decode.bs or [max_running()])
    return policy


def capture_policy_graphs(policy: StepPolicy, batch_sizes) -> None:
    """The policy's per-step device work as CUDA graphs (step_policy.PolicyGraphs), timed in the log."""
    start = time.perf_counter()
    graphs = policy.capture(batch_sizes)
    logger.info("DDTREE width policy graphs: observe at bs %s, learn at %d (bs, width), captured in %.1f s",
                graphs.sizes, len(graphs.learn), time.perf_counter() - start)


def rehearse_sampling(model_runner, verify_tokens: int, device) -> SamplingPrewarmResult:
    """The sampling verify of every node of every tree at once ([bs * N, V] probabilities), rehearsed so its
    memory peak is reserved; DFlash's own rehearsal (its chain sampling kernel) does not apply here."""
    n, vocab = verify_tokens, int(model_runner.model_config.vocab_size)
    bs = max(1, min(int(model_runner.max_running_requests or 1), model_runner.max_decode_logits_rows() // n))
    logits = torch.zeros((bs, n, vocab), dtype=torch.float32, device=device)           # [bs, N, V]
    params = SamplingParams(temperature=torch.ones(bs, device=device), top_k=None,
                            top_p=torch.full((bs,), 0.95, device=device), min_p=None, all_greedy=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    node_targets(logits, params, generator=None)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    size = logits.numel() * logits.element_size()
    result = SamplingPrewarmResult(sampling_input_bytes=size, sampling_headroom_bytes=peak + size)
    model_runner.sampling_prewarm_result = result
    logger.info("DDTREE sampling pre-warm: bs=%d x %d nodes, peak=%d B headroom=%d B", bs, n, peak,
                result.sampling_headroom_bytes)
    return result


def step_view(worker, kernels: str) -> StepView:
    """What the decode stages read, taken once from DFlashWorkerV2's own fields after its init_cuda_graphs (the
    draft's graphs, and whether the candidate head was folded into them, are decided there). The embedding module
    is resolved here once (DFlashWorkerV2 resolves it every step: the same module of the same loaded models).
    kernels: the stages' kernel backend, resolved once from the switches the worker read (no step reads the
    environment)."""
    target_runner = worker.target_worker.model_runner
    return StepView(
        device=torch.device(worker.device), block=int(worker.block_size), mask_token_id=int(worker._mask_token_id),
        block_pos_offsets=worker._block_pos_offsets, full_embed=worker._full_embed_gpu,
        embedding=unwrap_lora_layer(_resolve_dflash_embedding_module(worker.draft_model, target_runner.model)),
        embed_scale=float(worker._noise_embed_scale),
        req_to_token=worker.model_runner.req_to_token_pool.req_to_token,
        target_worker=worker.target_worker, target_kv=target_runner.kv_index_translator,
        target_has_graphs=target_runner.decode_cuda_graph_runner is not None,
        draft_runner=worker.draft_model_runner, draft_kv=worker.draft_model_runner.kv_index_translator,
        draft_spec_info=worker._draft_block_spec_info, draft_layout=worker.draft_parallel_layout,
        head_in_graph=worker._draft_sampler is not None,
        append_draft_context=worker._append_target_hidden_to_draft_kv_by_loc,
        next_draft_input=worker._make_next_draft_input_decode, kernels=kernels)
