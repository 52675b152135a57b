"""The body of POST /v1/responses as the official SDKs and the Agents SDK send it: `input` as text or as items
(messages with text parts, `function_call` and `function_call_output` items), function tools, `text.format`,
the sampling settings, `store` and `previous_response_id`. What Sluice cannot honour (built-in tools, images,
`background`, reasoning, ...) is refused naming the field (`Unsupported`), and a field the API does not know
is refused too; `to_sampling()` maps the sampling settings through wire.sampling by name."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    field_validator,
    model_validator,
)

from shim.openai_responses.refusals import ParamError, Unsupported, refuse_kinds
from shim.proto_values import Text, within
from wire.sampling import BOUNDS, Sampling
from wire.sampling import FIELDS as SAMPLING_FIELDS

MAX_TOOLS = 128
Probability = Annotated[float, within(BOUNDS["top_p"])]
Temperature = Annotated[float, within(BOUNDS["temperature"], high=2)]  # OpenAI's API stops at 2
Status = Literal["in_progress", "completed", "incomplete"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputText(_Strict):
    type: Literal["input_text"]
    text: Text


class OutputText(_Strict):
    """An earlier answer's text, as the SDKs send an output message back."""

    type: Literal["output_text"]
    text: Text
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: Text


Part = Annotated[InputText | OutputText | Refusal, Field(discriminator="type")]


class Message(_Strict):
    """A turn: `content` as text or parts; `id`, `status`, `phase`: what an echoed output message holds."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[Part]
    id: Text | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        refuse_kinds(content, "content", {"input_text", "output_text", "refusal"}, "text parts")
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCall(_Strict):
    """A call the model made, sent back so that its output can follow."""

    type: Literal["function_call"]
    call_id: Text = Field(min_length=1)
    name: Text = Field(min_length=1)
    arguments: Text
    id: Text | None = None
    status: Status | None = None


class FunctionCallOutput(_Strict):
    """What the caller's function returned for `call_id`."""

    type: Literal["function_call_output"]
    call_id: Text = Field(min_length=1)
    output: Text | list[InputText]
    id: Text | None = None
    status: Status | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _text_parts_only(cls, output: Any) -> Any:
        refuse_kinds(output, "output", {"input_text"}, "text output")
        return output

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


def _item_kind(value: Any) -> str | None:
    # A message may leave out its `type` (the SDKs' EasyInputMessage).
    return value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)


Item = Annotated[
    Annotated[Message, Tag("message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")],
    Discriminator(_item_kind),
]
ITEM_KINDS = {"message", "function_call", "function_call_output"}


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Text = Field(min_length=1, max_length=64)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None  # the Responses API's default is true
    defer_loading: Literal[False] | None = None  # tool search is a built-in tool


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: Text


class TextFormat(_Strict):
    """`text.format`: plain text, any JSON object, or JSON valid against `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = Field(default=None, min_length=1, max_length=64)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # a hint to OpenAI's models; only the default is kept


class ResponseStreamOptions(_Strict):
    include_obfuscation: StrictBool | None = None  # no obfuscation is ever added


#: Fields of OpenAI's request that Sluice cannot honour, accepted only as null (or the value that asks
#: nothing): what each would need.
_UNHONOURED = {
    "background": "background runs: a response is answered or streamed while the request lasts",
    "reasoning": "reasoning settings: the served models have no reasoning mode",
    "conversation": "conversations: chain responses with previous_response_id",
    "prompt": "stored prompt templates",
    "max_tool_calls": "a cap on built-in tool calls (there are no built-in tools)",
    "context_management": "server-side compaction",
    "prompt_cache_retention": "a cache retention policy: the prefix cache keeps what its memory allows",
    "top_logprobs": "log-probabilities on this route (POST /v1/chat/completions has them)",
}


class ResponsesRequest(_Strict):
    """POST /v1/responses."""

    model: Text = Field(min_length=1)
    input: Text | Annotated[list[Item], Field(max_length=4096)]
    instructions: Text | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    stream: StrictBool = False
    stream_options: ResponseStreamOptions | None = None
    store: StrictBool = True  # OpenAI's default
    previous_response_id: Text | None = Field(default=None, min_length=1)
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Text], Field(max_length=16)] | None = None
    user: Text | None = None  # forwarded to the server's access log
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None  # the prefix cache finds shared prefixes by itself
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None  # an input too long for the model is refused, never cut
    include: Annotated[list[str], Field(max_length=0)] | None = None  # nothing extra can be included
    background: Literal[False] | None = None
    reasoning: None = None
    conversation: None = None
    prompt: None = None
    max_tool_calls: None = None
    context_management: None = None
    prompt_cache_retention: None = None
    top_logprobs: Literal[0] | None = None

    @field_validator(*_UNHONOURED, "include", "truncation", mode="before")
    @classmethod
    def _unhonoured(cls, value: Any, info: Any) -> Any:
        name = str(info.field_name)
        if name == "include" and value:
            raise Unsupported("include", "including extra output (logprobs, encrypted reasoning, sources)")
        if name == "truncation" and value == "auto":
            raise Unsupported("truncation", "truncation: auto; an input too long for the model is refused")
        if name in _UNHONOURED and value not in (None, False, 0):
            raise Unsupported(name, _UNHONOURED[name])
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, items: Any) -> Any:
        refuse_kinds(items, "input", ITEM_KINDS, "messages and function calls", kind_of=_item_kind)
        return items

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, tools: Any) -> Any:
        refuse_kinds(tools, "tools", {"function"}, "function tools (built-in tools run at OpenAI)")
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, choice: Any) -> Any:
        if isinstance(choice, dict) and choice.get("type") not in (None, "function"):
            raise Unsupported("tool_choice", f"tool_choice of type {choice.get('type')!r}; name a function")
        return choice

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        names = [tool.name for tool in self.tools or ()]
        if len(set(names)) != len(names):
            raise ParamError("tools", "tool names must be unique")
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise ParamError("tool_choice", "tool_choice needs tools")
        if isinstance(self.tool_choice, FunctionChoice) and self.tool_choice.name not in names:
            chosen = self.tool_choice.name
            raise ParamError("tool_choice", f"tool_choice names {chosen!r}, which is not among the tools")
        shape = self.text.format if self.text is not None else None
        named = shape is None or (shape.name is not None and shape.schema_ is not None)
        if shape is not None and shape.type == "json_schema" and not named:
            raise ParamError("text.format", "text.format of type json_schema needs its name and schema")
        if not self.input and not self.previous_response_id:
            raise ParamError("input", "input is empty")
        return self

    def to_sampling(self) -> Sampling:
        """The Generate sampling settings: the fields Sampling names alike, by name; max_output_tokens is
        this API's name for max_tokens."""
        values = {name: getattr(self, name) for name in _alike()}
        values["max_tokens"] = self.max_output_tokens
        return Sampling.of(values)


@cache
def _alike() -> tuple[str, ...]:
    return tuple(sorted(SAMPLING_FIELDS & set(ResponsesRequest.model_fields)))
