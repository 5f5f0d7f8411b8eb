"""Middleware of ddtree-serve: the body limit, the API key, Connection: close while draining, and the
answers counted by route and status (SGLang's sglang:http_responses_total)."""

from __future__ import annotations

import hmac
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ddtree.serve.errors import error_body

# Probes need no API key and do no work; /health_generate runs a decode step, so it takes the key.
OPEN_PATHS = ("/health", "/ready", "/metrics")


def key_matches(authorization: str, api_key: str) -> bool:
    """`Authorization: Bearer <key>`, compared in constant time (no timing signal of a key prefix)."""
    return hmac.compare_digest(authorization.encode(), f"Bearer {api_key}".encode())


def any_key_matches(authorization: str, keys: tuple[str, ...]) -> bool:
    """Every accepted key is compared (no early exit: which key matched leaves no timing signal)."""
    return sum(key_matches(authorization, key) for key in keys) > 0


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


async def close_when_draining(request: Request, call_next):
    """A draining server ends every kept-alive connection after its answer: a gateway's health
    checker that connected as the drain began would otherwise hold the process open (it polls
    /health on one connection) until the graceful timeout."""
    response = await call_next(request)
    if request.app.state.draining:
        response.headers["connection"] = "close"
    return response


async def check_api_key(request: Request, call_next):
    keys = request.app.state.service.settings.accepted_keys()
    if keys and request.url.path not in OPEN_PATHS:
        if not any_key_matches(request.headers.get("authorization", ""), keys):
            return JSONResponse(error_body("Invalid or missing API key: send 'Authorization: Bearer <key>'",
                                           "authentication_error", 401), status_code=401)
    return await call_next(request)


async def count_responses(request: Request, call_next):
    """Every answer by its route's path (a path no route serves counts as "other": bounded labels), status code
    and method, as SGLang's http_request_metrics counts them."""
    response = await call_next(request)
    route = request.scope.get("route")
    endpoint = getattr(route, "path", None) or "other"
    request.app.state.service.metrics.http_responses.labels(endpoint, str(response.status_code), request.method).inc()
    return response


def add_middleware(app: FastAPI, max_request_bytes: int) -> None:
    """A request meets them in the reverse order of these lines (the last added is the outermost):
    the answer counter, the API key, the draining header on the way out, then the body limit."""
    app.add_middleware(BodyLimit, limit=max_request_bytes)
    app.middleware("http")(close_when_draining)
    app.middleware("http")(check_api_key)
    app.middleware("http")(count_responses)
