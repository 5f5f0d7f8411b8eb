"""Probes and metrics: /health, /health_generate, /ready (no work, no key except health_generate), /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ddtree.reference.engine import RequestParams
from ddtree.serve.errors import error_response
from ddtree.serve.service import Service, service_of

router = APIRouter()
PROBE_TIMEOUT_S = 60


def accepting(request: Request) -> bool:
    """Started and not draining (SIGTERM sets draining; see ddtree.serve.cli)."""
    return request.app.state.ready and not request.app.state.draining


@router.get("/health")
async def health(request: Request, service: Service = Depends(service_of)) -> Response:
    """Liveness without work: the app serves and the batch worker's thread runs."""
    return Response(status_code=200 if accepting(request) and service.worker.alive else 503)


@router.get("/health_generate")
async def health_generate(request: Request, service: Service = Depends(service_of)) -> Response:
    """Readiness through one decode step (takes the API key, like every route that runs the model)."""
    if not accepting(request):
        return Response(status_code=503)
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            done = await service.complete([service.tokenizer.bos_token_id], RequestParams(max_new_tokens=1))
    except TimeoutError:
        return Response(status_code=503)
    return Response(status_code=503 if done.error else 200)


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    ok = accepting(request)
    return JSONResponse({"status": "ready" if ok else "not ready"}, status_code=200 if ok else 503)


@router.get("/metrics")
async def prometheus(service: Service = Depends(service_of)) -> Response:
    if not service.settings.enable_metrics:
        return error_response("metrics are off: start with --enable-metrics", "not_found", 404)
    service.metrics.num_queue.set(service.worker.queued)
    service.metrics.num_running.set(service.worker.running)
    return PlainTextResponse(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
