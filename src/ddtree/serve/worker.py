"""The batching worker: one thread owns the model and runs batches of queued requests.

Requests wait in a queue; the worker takes up to `max_running` of them, decodes them together
step by step (each request stops on its own), streams every step's tokens back to the asyncio
side, then takes the next batch. An exception inside a batch fails that batch's requests only.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field

from ddtree.reference.engine import Decoder, Generation, RequestParams

log = logging.getLogger("ddtree.serve")


@dataclass
class Event:
    tokens: list[int] = field(default_factory=list)     # newly emitted tokens
    final: Generation | None = None                     # set on the last event
    error: str | None = None


@dataclass
class Job:
    prompt: list[int]
    params: RequestParams
    seed: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)
    streamed: bool = False              # a token reached the client (set by the worker thread)

    def push(self, event: Event) -> None:
        self.streamed = self.streamed or bool(event.tokens)
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class BatchStats:
    """Called back after every step with (verify steps, emitted tokens) of the live requests."""

    on_step: object = None
    on_finish: object = None


class BatchWorker:
    def __init__(self, decoder: Decoder, max_running: int, stats: BatchStats | None = None):
        self.decoder = decoder
        self.max_running = max_running
        self.stats = stats or BatchStats()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ddtree-batch-worker", daemon=True)
        self.running = 0

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def _take_batch(self) -> list[Job] | None:
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < self.max_running:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:  # stop after this batch
                self._queue.put(None)
                break
            batch.append(nxt)
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            live = [j for j in batch if not j.cancelled.is_set()]
            if not live:
                continue
            self.running = len(live)
            try:
                self._decode_isolated(live)
            finally:
                self.running = 0

    def _decode_isolated(self, jobs: list[Job]) -> None:
        """Decode a batch; when it fails, the requests that had received no token yet are decoded again
        one by one, so a request that fails fails alone. One that had already streamed tokens gets the
        error (its tokens cannot be taken back)."""
        try:
            self._decode(jobs)
            return
        except Exception as err:  # noqa: BLE001 - one bad request must not fail its batch or the worker
            log.exception("batch of %d requests failed", len(jobs))
            if len(jobs) == 1:
                jobs[0].push(Event(error=f"{type(err).__name__}: {err}"))
                return
            retry = [j for j in jobs if not j.streamed]
            for job in jobs:
                if job.streamed:
                    job.push(Event(error=f"{type(err).__name__}: {err}"))
        for job in retry:
            if not job.cancelled.is_set():
                self._decode_isolated([job])

    def _decode(self, jobs: list[Job]) -> None:
        seeds = {j.seed for j in jobs}
        seed = seeds.pop() if len(seeds) == 1 else None  # a seed is exact when its batch shares it
        state = self.decoder.start([j.prompt for j in jobs], [j.params for j in jobs], seed=seed)
        finished = [False] * len(jobs)
        while not state.done:
            for b, job in enumerate(jobs):
                if job.cancelled.is_set() and state.active[b]:
                    state.active[b] = False
            if state.done:
                break
            fresh = self.decoder.step(state)
            if self.stats.on_step:
                self.stats.on_step(state, fresh)
            for b, job in enumerate(jobs):
                if finished[b]:
                    continue
                done = not state.active[b]
                job.push(Event(tokens=fresh[b], final=state.outputs[b] if done else None))
                if done:
                    finished[b] = True
                    if self.stats.on_finish:
                        self.stats.on_finish(state.outputs[b])
        for b, job in enumerate(jobs):
            if not finished[b]:  # cancelled before finishing
                job.push(Event(final=state.outputs[b]))
