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


class NativeSamplingParams(BaseModel):
    """SGLang's native /generate sampling_params (the fields the reference engine honours)."""

    model_config = ConfigDict(extra="allow")

    max_new_tokens: int = Field(128, gt=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    stop_token_ids: list[int] | None = None


class GenerateRequest(BaseModel):
    """SGLang's native /generate request: one prompt as text or token ids, non-streaming."""

    model_config = ConfigDict(extra="allow")

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=20)
    stream: bool = Field(False, description="streaming is not supported on /generate here")
