"""What the server runs: /model_info, /server_info (SGLang's routes) and /v1/models (OpenAI's)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ddtree import __version__
from ddtree.serve.service import Service, service_of

router = APIRouter()


@router.get("/model_info")
async def model_info(service: Service = Depends(service_of)) -> dict:
    s = service.settings
    return {"model_path": s.model_path, "tokenizer_path": s.model_path, "is_generation": True,
            "model_type": service.decoder.pair.target.config.model_type, "served_model_name": s.served_model_name,
            "context_length": s.context_length, "vocab_size": service.tokenizer.vocab_size}


@router.get("/server_info")
async def server_info(service: Service = Depends(service_of)) -> dict:
    return {**service.settings.public(), "version": __version__, "method": service.decoder.method,
            "internal_states": [{"running": service.worker.running, "queued": service.worker.queued}]}


@router.get("/v1/models")
async def models(service: Service = Depends(service_of)) -> dict:
    s = service.settings
    return {"object": "list", "data": [{"id": s.served_model_name, "object": "model", "created": 0,
                                        "owned_by": "k26-ddtree", "root": s.model_path,
                                        "max_model_len": s.context_length}]}
