"""The data of one decode step of the reference engine, shared by the eager and the graphed path.

Layering: engine (Decoder) and graphed (GraphRunner) both import this module and each other only
one way (engine -> graphed); nothing here imports either.

  RequestParams / Generation   one request's parameters and result
  BatchState                   a batch in flight (host record + device state)
  Bucket                       a CUDA-graph bucket's static cache, context and generator
  StepIO                       what one step's stages read and write
  Stepper                      what the graph runner needs of a decoder
  run_marked                   run stages in order, optionally timing each
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ddtree.reference.cache import KVCache
from ddtree.reference.pair import Pair
from ddtree.reference.target import TargetOutput
from ddtree.types import DraftTree, SamplingParams, Verdict


@dataclass
class RequestParams:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop_token_ids: frozenset[int] = frozenset()
    logprobs_top: int = 0             # > 0: record each token's target log-prob and the top-k alternatives


@dataclass
class Generation:
    tokens: list[int]                 # generated tokens (a stop token, if hit, is the last one)
    num_verify_steps: int             # target passes after prefill
    accept_lengths: list[int]         # accepted draft tokens per step (0 for ar); tokens = that + 1
    finish_reason: str = "length"     # "stop" | "length" | "cancelled" (Decoder.cancel)
    # with RequestParams.logprobs_top = k > 0: per token (its target log-prob, [(id, log-prob)] x k)
    logprobs: list[tuple[float | None, list[tuple[int, float]]]] = field(default_factory=list)


@dataclass
class BatchState:
    """A batch being decoded: its cache and draft context, the roots and lengths a step reads, and
    the host's record (outputs, which requests are still active)."""

    cache: KVCache
    ctx: KVCache | None               # the draft's context for dflash/ddtree
    lengths: torch.Tensor             # int64 [bs] cached tokens = position of the root
    roots: torch.Tensor               # int64 [bs] last verified token
    params: SamplingParams
    requests: list[RequestParams]
    generator: torch.Generator | None
    outputs: list[Generation] = field(default_factory=list)
    active: list[bool] = field(default_factory=list)
    live: torch.Tensor | None = None   # bool [bs] on the device, mirrors `active` (read inside a step)
    live_of: list[bool] = field(default_factory=list)  # the `active` that `live` holds
    graph_bucket: Bucket | None = None  # the graph bucket this batch replays in, None = eager

    @property
    def done(self) -> bool:
        return not any(self.active)


@dataclass
class Bucket:
    """A CUDA-graph bucket: `size` batch rows x `slots` cache slots of static buffers (graphed)."""

    size: int
    slots: int
    cache: KVCache
    ctx: KVCache | None
    generator: torch.Generator
    owner: BatchState | None = None              # the batch decoding in this bucket now


@dataclass
class StepIO:
    """What one decode step reads and writes; under CUDA graphs these are the static buffers.

    Inputs (bs = batch or bucket): roots/lengths int64 [bs], live bool [bs], params, generator,
    cache, ctx. Stage outputs: draft_logits [bs, L, V], tree, out (TargetOutput), verdict;
    step outputs: emitted int64 [bs, E] (E = L+1, or 1 for ar), accept int64 [bs],
    node_logits [bs, E, V] (the target logits each emitted token was chosen from).
    """

    roots: torch.Tensor
    lengths: torch.Tensor
    live: torch.Tensor
    params: SamplingParams
    generator: torch.Generator | None
    cache: KVCache
    ctx: KVCache | None
    budget: int = 0                  # this step's tree width (a schedule's, by running batch); 0 = the decoder's
    topk_cap: int = 0
    draft_logits: torch.Tensor | None = None
    tree: DraftTree | None = None
    out: TargetOutput | None = None
    targets: torch.Tensor | None = None
    verdict: Verdict | None = None
    emitted: torch.Tensor | None = None
    accept: torch.Tensor | None = None
    node_logits: torch.Tensor | None = None


def run_marked(calls: Sequence[Callable[[], object]], marks: Sequence | None = None) -> None:
    """Run calls in order; with marks (timing), record marks[i] = (start, end) events around call i."""
    for i, call in enumerate(calls):
        if marks:
            marks[i][0].record()
        call()
        if marks:
            marks[i][1].record()


Stage = Callable[[StepIO], None]


class Stepper(Protocol):
    """What graphed.GraphRunner reads of the decoder it captures (engine.Decoder provides it)."""

    pair: Pair
    method: str
    device: torch.device

    @property
    def context_length(self) -> int: ...

    @property
    def window(self) -> int: ...

    def stages(self) -> list[tuple[str, Stage]]: ...
