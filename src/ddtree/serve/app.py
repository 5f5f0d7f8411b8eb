"""The FastAPI application: SGLang's operational routes and the OpenAI-compatible routes."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ddtree import __version__
from ddtree.reference.engine import Decoder, Generation, RequestParams
from ddtree.reference.tokenizer import ByteTokenizer
from ddtree.serve.metrics import ServerMetrics
from ddtree.serve.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest, SamplingFields
from ddtree.serve.worker import BatchStats, BatchWorker, Event, Job

# Probes need no API key and do no work; /health_generate runs a decode step, so it takes the key.
OPEN_PATHS = ("/health", "/ready", "/metrics")
MAX_STOPS = 16            # stop strings per request
MAX_STOP_CHARS = 256      # characters per stop string
MAX_STOP_TOKEN_IDS = 64
RETRY_AFTER_S = 2         # what a 503 for a full queue tells the client to wait


@dataclass
class ServerSettings:
    model_path: str
    draft_model_path: str | None
    speculative_algorithm: str
    budget: int
    topk_cap: int
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

    def public(self) -> dict:
        out = asdict(self)
        out["api_key"] = "<set>" if self.api_key else None
        return out


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class Overloaded(Exception):
    """The queue of waiting requests is full: 503 with Retry-After."""


def key_matches(authorization: str, api_key: str) -> bool:
    """`Authorization: Bearer <key>`, compared in constant time (no timing signal of a key prefix)."""
    return hmac.compare_digest(authorization.encode(), f"Bearer {api_key}".encode())


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 400 before any route parses it.

    A declared Content-Length is checked at once; a chunked body is read up to limit + 1 bytes and
    then replayed to the application (bodies here are small JSON documents).
    """

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._reject(send, int(declared))
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message)
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.limit:
                return await self._reject(send, size)
        return await self.app(scope, _replay(chunks, receive), send)

    async def _reject(self, send, size: int) -> None:
        body = json.dumps(error_body(f"request body is {size} bytes; the limit is {self.limit} "
                                     "(ddtree-serve --max-request-bytes): send a shorter prompt",
                                     "invalid_request_error", 400, "body")).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict], receive):
    """The body messages already read, then the connection's own receive (a streaming response
    listens on it for the client going away)."""
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()
    return replayed


def check_sampling_limits(body: SamplingFields, vocab_size: int, context_length: int, max_tokens: int) -> None:
    """Ranges the schema cannot know (vocabulary, context) and list sizes, as 400s naming the field."""
    if body.top_k != -1 and not 1 <= body.top_k <= vocab_size:
        raise BadRequest(f"top_k={body.top_k} is invalid: expected -1 (off) or 1..{vocab_size} (the vocabulary)",
                         "top_k")
    if max_tokens > context_length:
        raise BadRequest(f"max_tokens={max_tokens} is invalid: expected at most the context length {context_length}",
                         "max_tokens")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"stop is invalid: expected up to {MAX_STOPS} non-empty strings of at most "
                         f"{MAX_STOP_CHARS} characters", "stop")
    ids = body.stop_token_ids or []
    if len(ids) > MAX_STOP_TOKEN_IDS or any(not 0 <= t < vocab_size for t in ids):
        raise BadRequest(f"stop_token_ids is invalid: expected up to {MAX_STOP_TOKEN_IDS} ids in [0, {vocab_size})",
                         "stop_token_ids")


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def create_app(settings: ServerSettings, decoder: Decoder, tokenizer: ByteTokenizer) -> FastAPI:
    metrics = ServerMetrics(settings.served_model_name)
    worker = BatchWorker(decoder, settings.max_running_requests,
                         BatchStats(on_step=lambda s, f: _on_step(metrics, decoder.depth, f, s.graph_bucket is not None),
                                    on_finish=lambda g: metrics.num_requests.inc()))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        app.state.ready = True
        yield
        app.state.ready = False
        await asyncio.get_running_loop().run_in_executor(None, worker.stop)

    app = FastAPI(title="ddtree-serve", version=__version__, lifespan=lifespan)
    app.state.ready = False
    app.state.draining = False
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)

    @app.middleware("http")
    async def close_when_draining(request: Request, call_next):
        # a draining server ends every kept-alive connection after its answer: a gateway's health
        # checker that connected as the drain began would otherwise hold the process open (it polls
        # /health on one connection) until the graceful timeout
        response = await call_next(request)
        if app.state.draining:
            response.headers["connection"] = "close"
        return response

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if settings.api_key and request.url.path not in OPEN_PATHS:
            if not key_matches(request.headers.get("authorization", ""), settings.api_key):
                return JSONResponse(error_body("Invalid or missing API key: send 'Authorization: Bearer <key>'",
                                               "authentication_error", 401), status_code=401)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        msg = f"{loc or 'body'}: {first.get('msg', 'invalid request')}"
        if "input" in first and loc:
            msg += f" (got {json.dumps(first['input'], default=str)[:80]})"
        return JSONResponse(error_body(msg, "invalid_request_error", 400, loc), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        return JSONResponse(error_body(str(exc), "invalid_request_error", 400, exc.param), status_code=400)

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded):
        return JSONResponse(error_body(str(exc), "overloaded_error", 503), status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    async def run(prompt: list[int], params: RequestParams, seed: int | None):
        """Submit one request to the worker and yield its events until the last one."""
        if worker.queued >= settings.max_queued_requests:
            metrics.num_rejected.inc()
            raise Overloaded(f"{worker.queued} requests are waiting (--max-queued-requests "
                             f"{settings.max_queued_requests}): retry after {RETRY_AFTER_S} s")
        job = Job(prompt=prompt, params=params, seed=seed, loop=asyncio.get_running_loop(), events=asyncio.Queue())
        metrics.prompt_tokens.inc(len(prompt))
        worker.submit(job)
        metrics.num_queue.set(worker.queued)
        try:
            while True:
                event: Event = await job.events.get()
                yield event
                if event.final is not None or event.error is not None:
                    return
        finally:
            job.cancelled.set()  # finished, or the client went away

    def request_params(body: SamplingFields, prompt: list[int], max_tokens: int) -> RequestParams:
        if not prompt:
            raise BadRequest("prompt is empty: send at least one character or token id", "prompt")
        check_sampling_limits(body, tokenizer.vocab_size, settings.context_length, max_tokens)
        if len(prompt) >= settings.context_length:
            raise BadRequest(f"prompt has {len(prompt)} tokens; the context length is {settings.context_length}: "
                             "shorten the prompt", "prompt")
        bad = [t for t in prompt if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise BadRequest(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {tokenizer.vocab_size})",
                             "prompt")
        stops = set(body.stop_token_ids or ())
        return RequestParams(max_new_tokens=min(max_tokens, settings.context_length - len(prompt)),
                             temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
                             stop_token_ids=frozenset(stops | {tokenizer.eos_token_id}))

    async def health():
        """Liveness without work: the app serves and the batch worker's thread runs."""
        ok = app.state.ready and not app.state.draining and worker.alive
        return Response(status_code=200 if ok else 503)

    async def health_generate():
        """Readiness through one decode step (takes the API key, like every route that runs the model)."""
        if not app.state.ready or app.state.draining:
            return Response(status_code=503)
        params = RequestParams(max_new_tokens=1)
        try:
            async with asyncio.timeout(60):
                async for event in run([tokenizer.bos_token_id], params, None):
                    if event.error:
                        return Response(status_code=503)
        except TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/health_generate", health_generate, methods=["GET"])

    @app.get("/ready")
    async def ready():
        ok = app.state.ready and not app.state.draining
        return JSONResponse({"status": "ready" if ok else "not ready"}, status_code=200 if ok else 503)

    @app.get("/model_info")
    async def model_info():
        return {"model_path": settings.model_path, "tokenizer_path": settings.model_path, "is_generation": True,
                "model_type": decoder.pair.target.config.model_type, "served_model_name": settings.served_model_name,
                "context_length": settings.context_length, "vocab_size": tokenizer.vocab_size}

    @app.get("/server_info")
    async def server_info():
        return {**settings.public(), "version": __version__, "method": decoder.method,
                "internal_states": [{"running": worker.running, "queued": worker.queued}]}

    @app.get("/metrics")
    async def prometheus():
        if not settings.enable_metrics:
            return JSONResponse(error_body("metrics are off: start with --enable-metrics", "not_found", 404),
                                status_code=404)
        metrics.num_queue.set(worker.queued)
        metrics.num_running.set(worker.running)
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": settings.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "k26-ddtree", "root": settings.model_path,
                                            "max_model_len": settings.context_length}]}

    @app.post("/generate")
    async def generate_native(body: GenerateRequest):
        """SGLang's native route: output ids, and per-token log-probs with return_logprob."""
        if body.stream:
            raise BadRequest("stream=true is not supported on /generate by ddtree-serve: use /v1/completions", "stream")
        if (body.text is None) == (body.input_ids is None):
            raise BadRequest("send exactly one of 'text' and 'input_ids'", "text")
        if len(body.text if body.text is not None else body.input_ids) == 0:
            raise BadRequest("the prompt is empty: send at least one character or token id", "text")
        prompt = tokenizer.encode(body.text) if body.text is not None else list(body.input_ids)
        sp = body.sampling_params
        params = request_params(SamplingFields(max_tokens=sp.max_new_tokens, temperature=sp.temperature,
                                               top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
                                               stop_token_ids=sp.stop_token_ids), prompt, sp.max_new_tokens)
        if body.return_logprob:
            params = dataclasses.replace(params, logprobs_top=max(1, body.top_logprobs_num))
        tokens: list[int] = []
        final: Generation | None = None
        async for event in run(prompt, params, None):
            if event.error:
                return JSONResponse(error_body(event.error, "server_error", 500), status_code=500)
            tokens += event.tokens
            final = event.final or final
        meta = {"id": uuid.uuid4().hex, "prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                "finish_reason": ({"type": "stop", "matched": tokens[-1]} if final and final.finish_reason == "stop"
                                  else {"type": "length", "length": len(tokens)}),
                "spec_verify_ct": final.num_verify_steps if final else 0,
                "spec_accept_length": len(tokens) / max(1, final.num_verify_steps) if final else 0.0}
        if body.return_logprob and final is not None:
            meta["output_token_logprobs"] = [[lp, tok, None] for (lp, _), tok in zip(final.logprobs, tokens)]
            if body.top_logprobs_num > 0:
                meta["output_top_logprobs"] = [[[v, i, None] for i, v in top] for _, top in final.logprobs]
        return {"text": tokenizer.decode(tokens), "output_ids": tokens, "meta_info": meta}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        if len(body.prompt) == 0:  # "" would still encode to the BOS token
            raise BadRequest("prompt is empty: send at least one character or token id", "prompt")
        prompt = tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        params = request_params(body, prompt, body.max_tokens)
        return await respond(body, prompt, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        prompt = tokenizer.apply_chat_template([m.model_dump() for m in body.messages])
        params = request_params(body, prompt, body.max_completion_tokens or body.max_tokens)
        return await respond(body, prompt, params, chat=True)

    async def respond(body: SamplingFields, prompt: list[int], params: RequestParams, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        created = int(time.time())
        started = time.perf_counter()
        if body.stream:
            return StreamingResponse(stream(body, rid, created, prompt, params, stops, chat),
                                     media_type="text/event-stream")
        tokens: list[int] = []
        final: Generation | None = None
        async for event in run(prompt, params, body.seed):
            if event.error:
                return JSONResponse(error_body(event.error, "server_error", 500), status_code=500)
            tokens += event.tokens
            final = event.final or final
            text, hit = cut_at_stop(tokenizer.decode(tokens), stops)
            if hit:
                break
        metrics.e2e_latency.observe(time.perf_counter() - started)
        finish = "stop" if hit or final is None or final.finish_reason == "stop" else "length"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish} if chat
                  else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
               "model": settings.served_model_name, "choices": [choice],
               "usage": usage(len(prompt), len(tokens))}
        if body.return_spec_tokens_details and final is not None:
            out["sglext"] = {"spec_tokens_details": spec_details(final, len(tokens))}
        return out

    async def stream(body, rid, created, prompt, params, stops, chat):
        kind = "chat.completion.chunk" if chat else "text_completion"
        tokens: list[int] = []
        sent = ""
        final: Generation | None = None

        def chunk(delta: str, finish: str | None) -> str:
            choice = ({"index": 0, "delta": {"content": delta}, "finish_reason": finish} if chat
                      else {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish})
            return "data: " + json.dumps({"id": rid, "object": kind, "created": created,
                                          "model": settings.served_model_name, "choices": [choice]}) + "\n\n"

        if chat:
            yield "data: " + json.dumps({"id": rid, "object": kind, "created": created,
                                         "model": settings.served_model_name,
                                         "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                      "finish_reason": None}]}) + "\n\n"
        hit = False
        async for event in run(prompt, params, body.seed):
            if event.error:
                yield "data: " + json.dumps(error_body(event.error, "server_error", 500)) + "\n\n"
                return
            tokens += event.tokens
            final = event.final or final
            text, hit = cut_at_stop(tokenizer.decode(tokens), stops)
            if not hit and final is None and text.endswith("\ufffd"):
                continue  # an incomplete UTF-8 sequence: wait for its next byte
            if len(text) > len(sent):
                yield chunk(text[len(sent):], None)
                sent = text
            if hit:
                break
        finish = "stop" if hit or final is None or final.finish_reason == "stop" else "length"
        last = json.loads(chunk("", finish)[6:])
        last["usage"] = usage(len(prompt), len(tokens))
        if body.return_spec_tokens_details and final is not None:
            last["sglext"] = {"spec_tokens_details": spec_details(final, len(tokens))}
        yield "data: " + json.dumps(last) + "\n\n"
        yield "data: [DONE]\n\n"

    return app


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Text up to the first stop string (excluded), and whether one was found."""
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def spec_details(final: Generation, emitted: int) -> dict:
    steps = max(1, final.num_verify_steps)
    return {"spec_accept_length": emitted / steps, "spec_verify_ct": final.num_verify_steps,
            "spec_accept_token_num": sum(final.accept_lengths)}


def _on_step(metrics: ServerMetrics, depth: int, fresh: list[list[int]], replayed: bool) -> None:
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
