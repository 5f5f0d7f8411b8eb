"""What every route shares: the settings, the decoder's batch worker, the metrics, and `follow`,
the one loop over a request's decode events (buffered answers, streams and probes all use it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

from fastapi import FastAPI, Request

from ddtree.reference.engine import Decoder, Generation, RequestParams
from ddtree.reference.tokenizer import ByteTokenizer
from ddtree.serve.detokenize import IncrementalText, StopScan
from ddtree.serve.errors import RETRY_AFTER_S, BadRequest, Overloaded
from ddtree.serve.metrics import ServerMetrics, TokenTiming
from ddtree.serve.schemas import SamplingFields
from ddtree.serve.worker import BatchStats, BatchWorker, Event, Job

MAX_STOPS = 16            # stop strings per request
MAX_STOP_CHARS = 256      # characters per stop string
MAX_STOP_TOKEN_IDS = 64


@dataclass
class ServerSettings:
    model_path: str
    draft_model_path: str | None
    speculative_algorithm: str
    budget: int | str              # one value, or a schedule by running batch size as written (1:64,8:32)
    topk_cap: int | str
    block_size: int
    host: str
    port: int
    api_key: str | None
    enable_metrics: bool
    device: str
    dtype: str
    max_running_requests: int
    served_model_name: str
    context_length: int
    cuda_graph: bool = False
    max_queued_requests: int = 256
    max_request_bytes: int = 1 << 20
    previous_api_key: str | None = None   # still accepted during a key rotation

    def public(self) -> dict:
        out = asdict(self)
        for name in ("api_key", "previous_api_key"):
            out[name] = "<set>" if out[name] else None
        return out

    def accepted_keys(self) -> tuple[str, ...]:
        """The keys a request may carry: the current one and, during a rotation, the previous one."""
        return tuple(k for k in (self.api_key, self.previous_api_key) if k)


@dataclass
class Progress:
    """A request's output so far, after one of its decode events."""

    tokens: list[int]                 # every token emitted so far (one list, grown in place: copy to keep)
    text: str                         # their text, cut before the first stop string
    stopped: bool                     # a stop string ended the text
    final: Generation | None          # set once the engine finished the request
    error: str | None = None

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stopped or self.final is None or self.final.finish_reason == "stop" else "length"


def stop_strings(body: SamplingFields) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


def check_sampling_limits(body: SamplingFields, vocab_size: int, context_length: int, max_tokens: int) -> None:
    """Ranges the schema cannot know (vocabulary, context) and list sizes, as 400s naming the field."""
    if body.top_k != -1 and not 1 <= body.top_k <= vocab_size:
        raise BadRequest(f"top_k={body.top_k} is invalid: expected -1 (off) or 1..{vocab_size} (the vocabulary)",
                         "top_k")
    if max_tokens > context_length:
        raise BadRequest(f"max_tokens={max_tokens} is invalid: expected at most the context length {context_length}",
                         "max_tokens")
    stops = stop_strings(body)
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"stop is invalid: expected up to {MAX_STOPS} non-empty strings of at most "
                         f"{MAX_STOP_CHARS} characters", "stop")
    ids = body.stop_token_ids or []
    if len(ids) > MAX_STOP_TOKEN_IDS or any(not 0 <= t < vocab_size for t in ids):
        raise BadRequest(f"stop_token_ids is invalid: expected up to {MAX_STOP_TOKEN_IDS} ids in [0, {vocab_size})",
                         "stop_token_ids")


class Service:
    """The decoder behind a batch worker, with its metrics; routes reach it as request.app.state.service."""

    def __init__(self, settings: ServerSettings, decoder: Decoder, tokenizer: ByteTokenizer):
        self.settings = settings
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.metrics = ServerMetrics(settings.served_model_name)
        stats = BatchStats(on_step=lambda s, fresh: record_step(self.metrics, decoder.depth, fresh,
                                                                s.graph_bucket is not None),
                           on_finish=lambda g: self.metrics.num_requests.inc())
        self.worker = BatchWorker(decoder, settings.max_running_requests, stats)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        self.worker.start()
        app.state.ready = True
        yield
        app.state.ready = False
        await asyncio.get_running_loop().run_in_executor(None, self.worker.stop)

    async def run(self, prompt: list[int], params: RequestParams, seed: int | None) -> AsyncIterator[Event]:
        """Submit one request to the worker and yield its events until the last one."""
        if self.worker.queued >= self.settings.max_queued_requests:
            self.metrics.num_rejected.inc()
            raise Overloaded(f"{self.worker.queued} requests are waiting (--max-queued-requests "
                             f"{self.settings.max_queued_requests}): retry after {RETRY_AFTER_S} s")
        job = Job(prompt=prompt, params=params, seed=seed, loop=asyncio.get_running_loop(), events=asyncio.Queue())
        self.metrics.prompt_tokens.inc(len(prompt))
        timing = TokenTiming(started=time.perf_counter())
        self.worker.submit(job)
        self.metrics.num_queue.set(self.worker.queued)
        try:
            while True:
                event: Event = await job.events.get()
                self.metrics.record_tokens(timing, time.perf_counter(), len(event.tokens))
                yield event
                if event.final is not None or event.error is not None:
                    return
        finally:
            job.cancelled.set()  # finished, or the client went away

    async def follow(self, prompt: list[int], params: RequestParams, seed: int | None = None,
                     stops: list[str] | None = None) -> AsyncIterator[Progress]:
        """The request's Progress after each event; ends at its last event, an error or a stop string."""
        text = IncrementalText(self.tokenizer)        # decodes a short window per event, not the whole answer
        scan = StopScan(stops or [])
        final: Generation | None = None
        async for event in self.run(prompt, params, seed):
            if event.error:
                yield Progress(text.tokens, "", False, final, event.error)
                return
            final = event.final or final
            cut, hit = scan.cut(text.add(event.tokens), len(text.committed))
            yield Progress(text.tokens, cut, hit, final)
            if hit:
                return

    async def complete(self, prompt: list[int], params: RequestParams, seed: int | None = None,
                       stops: list[str] | None = None) -> Progress:
        """The request's last Progress (a buffered answer)."""
        last = Progress([], "", False, None)
        async for last in self.follow(prompt, params, seed, stops):
            pass
        return last

    def request_params(self, body: SamplingFields, prompt: list[int], max_tokens: int) -> RequestParams:
        """A validated request -> the engine's RequestParams (400 naming the field otherwise)."""
        vocab, context = self.tokenizer.vocab_size, self.settings.context_length
        if not prompt:
            raise BadRequest("prompt is empty: send at least one character or token id", "prompt")
        check_sampling_limits(body, vocab, context, max_tokens)
        if len(prompt) >= context:
            raise BadRequest(f"prompt has {len(prompt)} tokens; the context length is {context}: "
                             "shorten the prompt", "prompt")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "prompt")
        stops = set(body.stop_token_ids or ())
        return RequestParams(max_new_tokens=min(max_tokens, context - len(prompt)),
                             temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
                             stop_token_ids=frozenset(stops | {self.tokenizer.eos_token_id}))


def service_of(request: Request) -> Service:
    """The route dependency: the app's Service."""
    return request.app.state.service


def record_step(metrics: ServerMetrics, depth: int, fresh: list[list[int]], replayed: bool) -> None:
    """After a step: whether it replayed a CUDA graph, verify calls, tokens, tokens per step and the
    accepted share of the drafted depth."""
    metrics.is_cuda_graph.set(1 if replayed else 0)
    emitted = [len(f) for f in fresh if f]
    if not emitted:
        return
    metrics.spec_verify_calls.inc(len(emitted))
    metrics.generation_tokens.inc(sum(emitted))
    metrics.spec_accept_length.set(sum(emitted) / len(emitted))
    if depth > 0:
        metrics.spec_accept_rate.set((sum(emitted) - len(emitted)) / (len(emitted) * depth))
