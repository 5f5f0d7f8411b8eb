"""Chat: OpenAI's /v1/chat/completions (the byte tokenizer's chat template)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ddtree.serve.openai import respond
from ddtree.serve.schemas import ChatCompletionRequest
from ddtree.serve.service import Service, service_of

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, service: Service = Depends(service_of)):
    prompt = service.tokenizer.apply_chat_template([m.model_dump() for m in body.messages])
    params = service.request_params(body, prompt, body.max_completion_tokens or body.max_tokens)
    return await respond(service, body, prompt, params, chat=True)
