"""CUDA-graph decoding for the reference engine: one captured step per batch bucket.

A batch of n requests runs in the smallest bucket B >= n of `buckets` (default 1..32) and the
smallest slot count S (a power of two from 256, capped at the context length + the verify window)
that holds its longest prompt + max_new_tokens + window: attention reads all S slots, so S is
bucketed too. Each (B, S) bucket owns static buffers: the target's KV cache and the draft's
context ([*, B, ..., S, ...]), and per sampling signature a StepIO whose inputs are registered in a
BufferRegistry. A step copies the batch's roots / lengths / live flags / sampling parameters in
(checked at capture and at the first replay of each shape), replays the graph (or one graph per
stage, for timing), and copies the new roots / lengths back; padded rows stay inactive. Batches
larger than the biggest bucket, or arriving while their bucket is busy, run eagerly (logged once
per reason). A captured step has no host synchronisation: the engine's one sync per step is the
host commit after the replay.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass, field

import torch

from ddtree.graphs import BufferRegistry
from ddtree.reference.step import BatchState, Bucket, StepIO, Stepper, run_marked
from ddtree.types import SamplingParams

log = logging.getLogger(__name__)
BUCKETS = (1, 2, 4, 8, 16, 32)
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p")
# the values that switch a sampling filter off, for padded rows
OFF = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@dataclass(frozen=True)
class GraphKey:
    bucket: int
    slots: int
    all_greedy: bool
    filters: tuple[str, ...]     # which of top_k / top_p / min_p are on for the batch


@dataclass
class Captured:
    io: StepIO                                   # over the bucket's static buffers
    registry: BufferRegistry
    graphs: list[tuple[str, torch.cuda.CUDAGraph]] = field(default_factory=list)


def graph_key(bucket: Bucket, params: SamplingParams) -> GraphKey:
    filters = tuple(n for n in ("top_k", "top_p", "min_p") if getattr(params, n) is not None)
    return GraphKey(bucket=bucket.size, slots=bucket.slots, all_greedy=params.all_greedy, filters=filters)


def slot_bucket(needed: int, limit: int) -> int:
    """The smallest power of two >= needed (at least 256), capped at limit."""
    size = 256
    while size < needed:
        size *= 2
    return min(size, limit)


@contextlib.contextmanager
def gc_paused():
    """Collect Python's cyclic garbage, then keep the collector off while graphs are captured.

    torch 2.11's torch.cuda.graph no longer collects before capture (only with
    torch.compiler.config.force_cudagraph_gc), so a dead cycle holding CUDA objects (a dropped
    decoder's graphs, events, buffers) could be collected in the middle of a capture, and its
    destructors' CUDA calls invalidate the capture.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class GraphRunner:
    """Captures and replays a Decoder's step; `split_stages` captures one graph per stage (timing)."""

    def __init__(self, decoder: Stepper, buckets: tuple[int, ...] = BUCKETS, split_stages: bool = False):
        if decoder.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the pair on a CUDA device, got {decoder.device}: "
                             "load the pair with device='cuda' or decode eagerly")
        if not buckets or any(not isinstance(b, int) or b < 1 for b in buckets):
            raise ValueError(f"graph_buckets={buckets!r} is invalid: expected positive integers, e.g. {BUCKETS}")
        self.decoder = decoder
        self.buckets = tuple(sorted(set(buckets)))
        self.split_stages = split_stages
        self.max_slots = decoder.context_length + decoder.window
        self._buckets: dict[tuple[int, int], Bucket] = {}
        self._captured: dict[GraphKey, Captured] = {}
        self._logged: set[str] = set()
        self.capture_stream = torch.cuda.Stream()   # warm-up and capture share it

    def close(self) -> None:
        """Drop every captured graph, its buffers and the buckets' caches, then forget cuBLAS's cached
        workspaces. torch 2.11 keeps a workspace per (handle, stream) that may have been allocated inside
        a graph's private pool during capture; once the graphs are gone and torch.cuda.empty_cache()
        returns that pool's memory, the next cuBLAS call on the recycled stream used the stale workspace
        and a later capture failed (CUBLAS_STATUS_EXECUTION_FAILED; reproduced on the H200 after ~20
        decoders built and dropped in one process). The workspace cache is process-wide: close a runner
        only when no other graphed decoder of this process is still replaying. (An unclosed decoder is
        freed only by Python's cyclic collector - it and its runner reference each other; gc_paused keeps
        that out of captures.)"""
        torch.cuda.synchronize(self.decoder.device)
        self._captured.clear()
        self._buckets.clear()
        torch._C._cuda_clearCublasWorkspaces()       # torch 2.11: at::cuda::clearCublasWorkspaces()

    # ----- choosing ---------------------------------------------------------------------------
    def claim(self, state: BatchState, needed_slots: int) -> Bucket | None:
        """The bucket this new batch will replay in, or None (eager; the reason is logged once)."""
        n = len(state.requests)
        size = next((b for b in self.buckets if b >= n), None)
        if size is None:
            self._log_once(f"batch of {n} > largest captured bucket {self.buckets[-1]}: eager decode")
            return None
        bucket = self._bucket(size, slot_bucket(needed_slots, self.max_slots))
        if bucket.owner is not None and not bucket.owner.done:
            self._log_once(f"bucket {size} x {bucket.slots} slots busy with another batch: eager decode")
            return None
        bucket.owner = state
        return bucket

    def _log_once(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("cuda graphs: %s", reason)

    def _bucket(self, size: int, slots: int) -> Bucket:
        if (size, slots) not in self._buckets:
            d = self.decoder
            cache = d.pair.target.new_cache(size, slots)
            ctx = d.pair.draft.new_context(size, slots) if d.method != "ar" else None
            self._buckets[(size, slots)] = Bucket(size, slots, cache, ctx, torch.Generator(device=d.device))
        return self._buckets[(size, slots)]

    # ----- capture ----------------------------------------------------------------------------
    def prepare(self, state: BatchState, bucket: Bucket, seed: int | None) -> None:
        """Capture this batch's graph if new (before its prefill: warm-up writes the cache) and bind
        the batch to the bucket's cache / context rows and generator."""
        key = graph_key(bucket, state.params)
        if key not in self._captured:
            self._captured[key] = self._capture(key, bucket, state)
        n = len(state.requests)
        state.cache = bucket.cache.rows(n)
        if bucket.ctx is not None:
            state.ctx = bucket.ctx.rows(n)
        if not state.params.all_greedy:
            bucket.generator.manual_seed(seed if seed is not None else int(torch.seed() % 2**62))
            state.generator = bucket.generator
        state.graph_bucket = bucket
        cap = self._captured[key]
        cap.io.live.fill_(False)                              # padded rows: inactive, at slot 0
        cap.io.lengths.zero_()
        cap.io.roots.zero_()

    def _capture(self, key: GraphKey, bucket: Bucket, state: BatchState) -> Captured:
        d, b = self.decoder, bucket.size
        dev = d.device
        registry = BufferRegistry(f"decode graph (bucket {b} x {bucket.slots} slots, {d.method})")
        reg = registry.register
        params = SamplingParams(
            temperature=reg("temperature", torch.zeros(b, dtype=torch.float32, device=dev)),
            top_k=reg("top_k", torch.zeros(b, dtype=torch.int64, device=dev)) if "top_k" in key.filters else None,
            top_p=reg("top_p", torch.ones(b, dtype=torch.float32, device=dev)) if "top_p" in key.filters else None,
            min_p=reg("min_p", torch.zeros(b, dtype=torch.float32, device=dev)) if "min_p" in key.filters else None,
            all_greedy=key.all_greedy)
        io = StepIO(roots=reg("roots", torch.zeros(b, dtype=torch.int64, device=dev)),
                    lengths=reg("lengths", torch.zeros(b, dtype=torch.int64, device=dev)),
                    live=reg("live", torch.zeros(b, dtype=torch.bool, device=dev)),
                    params=params, generator=None if key.all_greedy else bucket.generator,
                    cache=bucket.cache, ctx=bucket.ctx)
        cap = Captured(io=io, registry=registry)
        registry.copy_in(self._sources(state), "capture")   # names a missing source before any kernel runs
        io.live.fill_(False)
        stages = d.stages()
        self._warm_up(io, stages)
        groups = [[s] for s in stages] if self.split_stages else [stages]
        pool = None                                # split capture: the stage graphs share one pool
        with gc_paused():
            for group in groups:
                graph = torch.cuda.CUDAGraph()
                if io.generator is not None:
                    graph.register_generator_state(io.generator)
                with torch.cuda.graph(graph, pool=pool, stream=self.capture_stream):
                    for _, stage in group:
                        stage(io)
                cap.graphs.append(("+".join(n for n, _ in group), graph))
                pool = graph.pool()
        log.info("cuda graphs: captured %s bucket %d x %d slots (%s)", d.method, b, bucket.slots,
                 ", ".join(n for n, _ in cap.graphs))
        return cap

    def _warm_up(self, io, stages) -> None:
        """Run the stages eagerly on the capture stream before capture: Triton compiles, and cuBLAS
        allocates that stream's workspace outside any graph's private memory pool."""
        side = self.capture_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                for _, stage in stages:
                    stage(io)
        torch.cuda.current_stream().wait_stream(side)

    # ----- replay -----------------------------------------------------------------------------
    def _sources(self, state: BatchState) -> dict[str, torch.Tensor | None]:
        p = state.params
        sources = {"roots": state.roots, "lengths": state.lengths, "live": state.live}
        sources.update({n: getattr(p, n) for n in SAMPLING_FIELDS})
        return sources

    def replay(self, state: BatchState, marks=None) -> StepIO:
        """One step of a bound batch: copy in, replay, copy the new roots / lengths back; -> StepIO rows.

        marks (timing): one (start, end) pair with .record() per captured graph, recorded around it.
        """
        cap = self.captured(state)
        n = len(state.requests)
        if marks and len(marks) != len(cap.graphs):
            raise ValueError(f"marks has {len(marks)} pairs for {len(cap.graphs)} graphs: time stages with "
                             "split_stages=True")
        cap.registry.copy_in(self._sources(state), "replay")
        run_marked([graph.replay for _, graph in cap.graphs], marks)
        io = cap.io
        state.roots.copy_(io.roots[:n])
        state.lengths.copy_(io.lengths[:n])
        return StepIO(roots=state.roots, lengths=state.lengths, live=state.live, params=state.params,
                      generator=state.generator, cache=state.cache, ctx=state.ctx,
                      emitted=io.emitted[:n], accept=io.accept[:n], node_logits=io.node_logits[:n])

    def captured(self, state: BatchState) -> Captured:
        return self._captured[graph_key(state.graph_bucket, state.params)]
