"""The answers of the OpenAI routes as pydantic models: the schemas /openapi.json publishes and tests check
answers against. The serving modules build plain dicts (no model per request on the hot path)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens the server's prefix cache held


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class RequestMetrics(BaseModel):
    """vLLM's per-request `metrics`, from the server's timings (shim/request_metrics.py)."""

    queue_time_ms: float  # arrival at the server to the first step it joined
    time_to_first_token_ms: float  # arrival at the server to the first token
    generation_time_ms: float  # first token to last
    mean_itl_ms: float  # mean gap between two tokens
    tokens_per_second: float  # completion tokens over generation_time_ms


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    metrics: RequestMetrics | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    metrics: RequestMetrics | None = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    # Sluice's own, beside OpenAI's (as vLLM adds max_model_len): the weights' weight-only quantization.
    quantization: str
    # vLLM's: the base model a LoRA adapter is served over; null for a model of its own.
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]
