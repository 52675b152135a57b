"""The answers of the Anthropic family, for /openapi.json (and the tests that hold answers to them): a
Message, the token count, the models page. Named apart from other families' schemas, which share one
components table."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class AnthropicTextBlock(BaseModel):
    type: Literal["text"]
    text: str


class AnthropicToolUseBlock(BaseModel):
    """A call the model made: `input` is its arguments object."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicMessage(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[Annotated[AnthropicTextBlock | AnthropicToolUseBlock, Field(discriminator="type")]]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicTokensCount(BaseModel):
    input_tokens: int


class AnthropicModel(BaseModel):
    type: Literal["model"]
    id: str
    display_name: str
    created_at: str


class AnthropicModelsPage(BaseModel):
    data: list[AnthropicModel]
    has_more: bool
    first_id: str | None
    last_id: str | None
