"""The FastAPI application of ddtree-serve: SGLang's operational routes and the OpenAI-compatible ones.

create_app is the table of contents; the parts are
  service.py      the settings, the batch worker, metrics, and the one loop over decode events
  middleware.py   body limit, API key, Connection: close while draining
  errors.py       OpenAI's error body for 400 / 401 / 500 / 503
  routes/         health and metrics, admin (model and server info), completions (+ /generate), chat
  openai.py       the buffered and the streamed answer
"""

from __future__ import annotations

from fastapi import FastAPI

from ddtree import __version__
from ddtree.reference.engine import Decoder
from ddtree.reference.tokenizer import ByteTokenizer
from ddtree.serve.errors import add_error_handlers
from ddtree.serve.middleware import add_middleware
from ddtree.serve.routes import ROUTERS
from ddtree.serve.service import ServerSettings, Service

__all__ = ["ServerSettings", "create_app"]


def create_app(settings: ServerSettings, decoder: Decoder, tokenizer: ByteTokenizer) -> FastAPI:
    service = Service(settings, decoder, tokenizer)
    app = FastAPI(title="ddtree-serve", version=__version__, lifespan=service.lifespan)
    app.state.service = service
    app.state.ready = False        # set by the lifespan once the batch worker runs
    app.state.draining = False     # set by ddtree.serve.cli on SIGTERM
    add_middleware(app, settings.max_request_bytes)
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app
