"""The target's verify resources for each width of a DDTree budget schedule (issue 32; imports SGLang).

A schedule (`--speculative-ddtree-budget 1:64,8:32,32:8`) verifies budget(b) + 1 tokens per request when b
requests run. SGLang sizes the server for the widest step: its target model runner's attention backend and
target-verify CUDA graphs are built at that width (speculative_num_draft_tokens). For every narrower width
this module builds, at start-up, what SGLang's own adaptive EAGLE worker builds for each of its step
configurations: a fresh attention backend of the target (its CUDA-graph buffers sized for that width) and a
DecodeCudaGraphRunner captured at that width, only for the batch sizes that use it (each running batch size
of its range padded up to a size SGLang captures). A decode step swaps the runner's attention backend and
graph runner to its width's around its verify pass and puts them back after (TargetWidths.active).

With CUDA graphs off no state is built: SGLang's triton backend takes each step's width from the verify
input (num_tokens_per_req). Memory and time of every capture are logged.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from dataclasses import dataclass, field

from sglang.srt.runtime_context import get_context, get_exec, get_spec
from sglang.srt.utils import get_available_gpu_memory

from ddtree.settings import WidthSchedule

logger = logging.getLogger(__name__)


@dataclass
class WidthState:
    """What the target's verify pass needs at one width."""

    width: int
    batches: list[int]              # running batch sizes whose step verifies this width
    attn_backend: object
    graph_runner: object | None
    graph_batches: list[int] = field(default_factory=list)   # batch sizes its graphs were captured for
    memory_gb: float = 0.0


def padded_batches(batches: list[int], captured: list[int]) -> list[int]:
    """The captured batch sizes that serve `batches`: each running size padded up to the next captured one
    (SGLang replays a graph of the smallest captured size >= the batch). [] when none is captured."""
    ordered = sorted(captured)
    out = set()
    for b in batches:
        i = bisect.bisect_left(ordered, b)
        if i < len(ordered):
            out.add(ordered[i])
    return sorted(out)


class TargetWidths:
    """The target model runner's verify state per width: the widest is SGLang's own; the others built here."""

    def __init__(self, model_runner, schedule: WidthSchedule, widest: int, max_bs: int):
        self.runner = model_runner
        main = model_runner.decode_cuda_graph_runner
        self.states = {widest: WidthState(widest, schedule.batches_at_width(widest, max_bs),
                                          model_runner.attn_backend, main,
                                          list(getattr(main, "capture_bs", []) or []))}
        if main is None:
            return                                   # graphs off: one backend, the width travels per step
        for width in schedule.widths:
            if width != widest:
                batches = schedule.batches_at_width(width, max_bs)
                if batches:
                    self.states[width] = self._build(width, batches, padded_batches(batches, main.capture_bs))

    def _build(self, width: int, batches: list[int], graph_batches: list[int]) -> WidthState:
        runner = self.runner
        main = runner.decode_cuda_graph_runner
        widest = get_spec().speculative_num_draft_tokens
        decode = get_exec().graph.cuda_graph_config.decode       # SGLang's capture list (get_batch_sizes_to_capture)
        kept_bs = decode.bs
        before, tic = get_available_gpu_memory(runner.device, runner.gpu_id), time.perf_counter()
        # the new backend sizes its verify buffers by SGLang's speculative_num_draft_tokens (through the spec's
        # get_num_tokens_per_req_for_target_verify): that width while it is built
        get_context().override("ddtree.width_capture", speculative_num_draft_tokens=width)
        decode.bs = list(graph_batches)
        try:
            keep = runner.init_new_workspace
            try:
                backend = runner._get_attention_backend(init_new_workspace=True)
            finally:
                runner.init_new_workspace = keep
            graphs = type(main)(runner, attn_backend=backend, speculative_num_draft_tokens=width) if graph_batches \
                else None
        finally:
            decode.bs = kept_bs
            get_context().override("ddtree.width_restore", speculative_num_draft_tokens=widest)
        used = before - get_available_gpu_memory(runner.device, runner.gpu_id)
        logger.info("DDTREE verify width %d (batch sizes %d..%d): graphs for bs %s captured in %.1f s, %.3f GB",
                    width, batches[0], batches[-1], graph_batches, time.perf_counter() - tic, used)
        return WidthState(width, batches, backend, graphs, graph_batches, used)

    @contextlib.contextmanager
    def active(self, width: int):
        """The target runner with `width`'s attention backend and graphs for the block (the widest: as is)."""
        state = self.states.get(width)
        runner = self.runner
        if state is None or state.attn_backend is runner.attn_backend:
            yield
            return
        kept = runner.attn_backend, runner.decode_cuda_graph_runner
        runner.attn_backend, runner.decode_cuda_graph_runner = state.attn_backend, state.graph_runner
        try:
            yield
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = kept

    def memory_report(self) -> str:
        return ", ".join(f"width {s.width}: bs {s.batches[0]}..{s.batches[-1]} graphs {s.graph_batches} "
                         f"{s.memory_gb:.3f} GB" for s in sorted(self.states.values(), key=lambda s: s.width)
                         if s.batches)
