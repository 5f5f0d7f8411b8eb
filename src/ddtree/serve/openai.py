"""OpenAI-style answers for completions and chat: one buffered body or one server-sent event stream,
both read from Service.follow."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import JSONResponse, StreamingResponse

from ddtree.reference.engine import Generation, RequestParams
from ddtree.serve.errors import error_body, error_response
from ddtree.serve.schemas import SamplingFields
from ddtree.serve.service import Progress, Service, stop_strings


@dataclass(frozen=True)
class Answer:
    """One request's answer envelope: id, object kind, time, model; chat or text choices."""

    rid: str
    created: int
    model: str
    chat: bool

    @classmethod
    def new(cls, model: str, chat: bool) -> Answer:
        return cls(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()), model, chat)

    def envelope(self, kind: str, choice: dict) -> dict:
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def body(self, text: str, finish: str) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
        return self.envelope("chat.completion" if self.chat else "text_completion", choice)

    def chunk(self, delta: str | None, finish: str | None, role: bool = False) -> dict:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        if role:
            return self.envelope(kind, {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None})
        choice = ({"index": 0, "delta": {"content": delta}, "finish_reason": finish} if self.chat
                  else {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish})
        return self.envelope(kind, choice)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def spec_details(final: Generation, emitted: int) -> dict:
    steps = max(1, final.num_verify_steps)
    return {"spec_accept_length": emitted / steps, "spec_verify_ct": final.num_verify_steps,
            "spec_accept_token_num": sum(final.accept_lengths)}


def sse(data: dict | str) -> str:
    return "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n"


def with_totals(out: dict, body: SamplingFields, prompt: list[int], done: Progress) -> dict:
    """usage, and SGLang's spec_tokens_details when the request asked for them."""
    out["usage"] = usage(len(prompt), len(done.tokens))
    if body.return_spec_tokens_details and done.final is not None:
        out["sglext"] = {"spec_tokens_details": spec_details(done.final, len(done.tokens))}
    return out


async def respond(service: Service, body: SamplingFields, prompt: list[int], params: RequestParams,
                  chat: bool):
    """The answer to a completions or chat request: buffered, or streamed with stream=true."""
    answer = Answer.new(service.settings.served_model_name, chat)
    if body.stream:
        return StreamingResponse(stream(service, answer, body, prompt, params), media_type="text/event-stream")
    started = time.perf_counter()
    done = await service.complete(prompt, params, body.seed, stop_strings(body))
    if done.error:
        return error_response(done.error, "server_error", 500)
    service.metrics.e2e_latency.observe(time.perf_counter() - started)
    return with_totals(answer.body(done.text, done.finish_reason), body, prompt, done)


async def stream(service: Service, answer: Answer, body: SamplingFields, prompt: list[int],
                 params: RequestParams) -> AsyncIterator[str]:
    """Server-sent events: (chat: the role first) one chunk per new piece of text, the last chunk with
    the finish reason and usage, then [DONE]; an error ends the stream with an error event."""
    if answer.chat:
        yield sse(answer.chunk(None, None, role=True))
    sent = ""
    done = Progress([], "", False, None)
    async for done in service.follow(prompt, params, body.seed, stop_strings(body)):
        if done.error:
            yield sse(error_body(done.error, "server_error", 500))
            return
        if not done.stopped and done.final is None and done.text.endswith("\ufffd"):
            continue  # an incomplete UTF-8 sequence: wait for its next byte
        if len(done.text) > len(sent):
            yield sse(answer.chunk(done.text[len(sent):], None))
            sent = done.text
    yield sse(with_totals(answer.chunk("", done.finish_reason), body, prompt, done))
    yield sse("[DONE]")


def native_answer(service: Service, done: Progress, prompt: list[int], top_logprobs: int | None) -> dict | JSONResponse:
    """SGLang's /generate body: text, output ids, meta_info (log-probs when asked: top_logprobs not None)."""
    if done.error:
        return error_response(done.error, "server_error", 500)
    tokens, final = done.tokens, done.final
    meta = {"id": uuid.uuid4().hex, "prompt_tokens": len(prompt), "completion_tokens": len(tokens),
            "finish_reason": ({"type": "stop", "matched": tokens[-1]} if final and final.finish_reason == "stop"
                              else {"type": "length", "length": len(tokens)}),
            "spec_verify_ct": final.num_verify_steps if final else 0,
            "spec_accept_length": len(tokens) / max(1, final.num_verify_steps) if final else 0.0}
    if top_logprobs is not None and final is not None:
        meta["output_token_logprobs"] = [[lp, tok, None] for (lp, _), tok in zip(final.logprobs, tokens)]
        if top_logprobs > 0:
            meta["output_top_logprobs"] = [[[v, i, None] for i, v in top] for _, top in final.logprobs]
    return {"text": done.text, "output_ids": tokens, "meta_info": meta}   # follow decoded them (no stops here)
