"""Completions: OpenAI's /v1/completions and SGLang's native /generate."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Depends

from ddtree.serve.errors import BadRequest
from ddtree.serve.openai import native_answer, respond
from ddtree.serve.schemas import CompletionRequest, GenerateRequest, SamplingFields
from ddtree.serve.service import Service, service_of

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, service: Service = Depends(service_of)):
    if len(body.prompt) == 0:  # "" would still encode to the BOS token
        raise BadRequest("prompt is empty: send at least one character or token id", "prompt")
    prompt = service.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    params = service.request_params(body, prompt, body.max_tokens)
    return await respond(service, body, prompt, params, chat=False)


@router.post("/generate")
async def generate_native(body: GenerateRequest, service: Service = Depends(service_of)):
    """SGLang's native route: output ids, and per-token log-probs with return_logprob."""
    if body.stream:
        raise BadRequest("stream=true is not supported on /generate by ddtree-serve: use /v1/completions", "stream")
    if (body.text is None) == (body.input_ids is None):
        raise BadRequest("send exactly one of 'text' and 'input_ids'", "text")
    if len(body.text if body.text is not None else body.input_ids) == 0:
        raise BadRequest("the prompt is empty: send at least one character or token id", "text")
    prompt = service.tokenizer.encode(body.text) if body.text is not None else list(body.input_ids)
    sp = body.sampling_params
    params = service.request_params(SamplingFields(max_tokens=sp.max_new_tokens, temperature=sp.temperature,
                                                   top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
                                                   stop_token_ids=sp.stop_token_ids), prompt, sp.max_new_tokens)
    if body.return_logprob:
        params = dataclasses.replace(params, logprobs_top=max(1, body.top_logprobs_num))
    done = await service.complete(prompt, params)
    return native_answer(service, done, prompt, body.top_logprobs_num if body.return_logprob else None)
