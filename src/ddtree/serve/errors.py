"""The server's error answers: OpenAI's error body, and the handlers that turn exceptions into it."""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

RETRY_AFTER_S = 2         # what a 503 for a full queue tells the client to wait


class BadRequest(Exception):
    """400 naming the field (param), the value and what is allowed."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class Overloaded(Exception):
    """The queue of waiting requests is full: 503 with Retry-After."""


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(message: str, kind: str, code: int, param: str | None = None, **kw) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param), status_code=code, **kw)


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """pydantic's first complaint as a 400 naming the field and the value it got."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    msg = f"{loc or 'body'}: {first.get('msg', 'invalid request')}"
    if "input" in first and loc:
        msg += f" (got {json.dumps(first['input'], default=str)[:80]})"
    return error_response(msg, "invalid_request_error", 400, loc)


async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
    return error_response(str(exc), "invalid_request_error", 400, exc.param)


async def overloaded(request: Request, exc: Overloaded) -> JSONResponse:
    return error_response(str(exc), "overloaded_error", 503, headers={"Retry-After": str(RETRY_AFTER_S)})


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(Overloaded, overloaded)
