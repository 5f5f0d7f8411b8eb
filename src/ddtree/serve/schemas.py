"""Request bodies of the OpenAI-compatible routes (pydantic validates types and ranges)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are accepted and ignored

    model: str | None = None
    max_tokens: int = Field(16, gt=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1)
    return_spec_tokens_details: bool = False


class CompletionRequest(SamplingFields):
    prompt: str | list[int]


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)
