"""The request bodies of /tokenize and /detokenize, as vLLM's: a prompt (`add_special_tokens` default
true) or chat messages in OpenAI's shape (the chat template applied, `add_generation_prompt` default
true, `add_special_tokens` default false, optional `tools`), and token ids back to text. What Sluice
cannot honour (`return_token_strs`, a caller's `chat_template`, `continue_final_message`) is refused
naming it; an unknown field is refused too."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from shim.proto_values import Int32, Text
from wire.constraint import Tool

MAX_TOOLS = 128


class Unsupported(ValueError):
    """A field Sluice does not honour; `param` names it."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param} is not supported: {why}")
        self.param = param


class _TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Text = Field(min_length=1)


class TokenizeTextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text"]
    text: Text


class TokenizeFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text = Field(min_length=1, max_length=64)
    arguments: Text = "{}"


class TokenizeToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Text
    type: Literal["function"] = "function"
    function: TokenizeFunction


class TokenizeMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TokenizeTextPart] | None = None
    name: Text | None = None
    tool_calls: list[TokenizeToolCall] | None = None
    tool_call_id: Text | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class TokenizeFunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text = Field(min_length=1, max_length=64)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class TokenizeTool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: TokenizeFunctionDef

    def to_tool(self) -> Tool:
        f = self.function
        schema = json.dumps(f.parameters) if f.parameters is not None else ""
        return Tool(f.name, f.description or "", schema, strict=bool(f.strict))


class TokenizeRequest(_TokenizeBody):
    """POST /tokenize: `prompt`, or `messages` (exactly one)."""

    prompt: Text | None = None
    messages: Annotated[list[TokenizeMessage], Field(min_length=1)] | None = None
    add_special_tokens: StrictBool | None = None  # vLLM's default: true for a prompt, false for messages
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    tools: Annotated[list[TokenizeTool], Field(max_length=MAX_TOOLS)] | None = None
    return_token_strs: StrictBool | None = None
    chat_template: Text | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        if self.tools and self.messages is None:
            raise ValueError("tools go with messages")
        if self.return_token_strs:
            raise Unsupported("return_token_strs", "ask /detokenize for the text of token ids")
        if self.continue_final_message:
            raise Unsupported("continue_final_message", "the prompt ends a turn or opens the next")
        if self.chat_template is not None or self.chat_template_kwargs:
            field = "chat_template" if self.chat_template is not None else "chat_template_kwargs"
            raise Unsupported(field, "the model's own chat template is the one applied")
        return self


class DetokenizeRequest(_TokenizeBody):
    """POST /detokenize."""

    tokens: Annotated[list[Int32], Field(max_length=1 << 20)]
