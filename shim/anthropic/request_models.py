"""The request bodies of /v1/messages and /v1/messages/count_tokens as Anthropic's SDKs send them: `system`,
`messages` of text, `tool_use` and `tool_result` blocks, the sampling settings, `tools` with their
`input_schema`, `tool_choice`. What Sluice cannot honour (images, documents, extended thinking, Anthropic's
server tools) is refused naming it; an unknown field is refused too; `cache_control` is taken and needs
nothing (the server's prefix cache keeps every prompt's prefix without being asked)."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, model_validator

from shim.proto_values import Int32, Text, within
from wire.sampling import BOUNDS, Sampling
from wire.sampling import FIELDS as SAMPLING_FIELDS

MAX_TOOLS = 128
ToolName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class Unsupported(ValueError):
    """A field or block Sluice does not honour; `param` names it, from the model that raised it."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param}: {why}")
        self.param = param


class _AnthropicStrict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextBlock(_AnthropicStrict):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None  # what the SDK echoes back of an answer's block


class ToolUseBlock(_AnthropicStrict):
    type: Literal["tool_use"]
    id: Text = Field(min_length=1)
    name: Text = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    caller: dict[str, Any] | None = None  # what the SDK echoes back of an answer's block


class ToolResultBlock(_AnthropicStrict):
    type: Literal["tool_result"]
    tool_use_id: Text = Field(min_length=1)
    content: Text | list[TextBlock] | None = None
    is_error: StrictBool | None = None
    cache_control: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or ())
        return f"Error: {text}" if self.is_error else text


class _OtherBlock(BaseModel):
    """A block of a kind Sluice does not read (image, document, thinking, ...): refused naming its type."""

    type: str

    @model_validator(mode="after")
    def _refuse(self) -> _OtherBlock:
        raise Unsupported(
            "type", f"{self.type} blocks are not supported (text, tool_use and tool_result are)"
        )


#: The tags of a content block's kinds in an error's location, which name no place in the body.
TAG = "block:"


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return TAG + (kind if kind in ("text", "tool_use", "tool_result") else "other")


Block = Annotated[
    Annotated[TextBlock, Tag(TAG + "text")]
    | Annotated[ToolUseBlock, Tag(TAG + "tool_use")]
    | Annotated[ToolResultBlock, Tag(TAG + "tool_result")]
    | Annotated[_OtherBlock, Tag(TAG + "other")],
    Discriminator(_block_kind),
]


class MessageParam(_AnthropicStrict):
    role: Literal["user", "assistant"]
    content: Text | list[Block]

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> MessageParam:
        for block in self.content if isinstance(self.content, list) else ():
            if self.role == "user" and isinstance(block, ToolUseBlock):
                raise ValueError("tool_use blocks belong in assistant messages")
            if self.role == "assistant" and isinstance(block, ToolResultBlock):
                raise ValueError("tool_result blocks belong in user messages")
        return self


class ToolDef(_AnthropicStrict):
    name: ToolName
    description: Text | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise Unsupported("type", f"{str(data['type'])[:64]!r} is one of Anthropic's server tools")
        return data


class ToolChoiceParam(_AnthropicStrict):
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("a tool_choice of type tool names the tool, and only that type does")
        return self


class Metadata(_AnthropicStrict):
    user_id: Text | None = None


class Conversation(_AnthropicStrict):
    """What /v1/messages and its count_tokens share."""

    model: Text = Field(min_length=1)
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: Text | list[TextBlock] | None = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> Conversation:
        if self.thinking is not None and self.thinking.get("type") != "disabled":
            raise Unsupported("thinking", "extended thinking is not supported")
        names = [t.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        choice = self.tool_choice
        if choice is not None and choice.type != "none" and not names:
            raise ValueError("tool_choice needs tools")
        if choice is not None and choice.name is not None and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
        return self

    @property
    def system_text(self) -> str:
        if self.system is None or isinstance(self.system, str):
            return self.system or ""
        return "".join(block.text for block in self.system)


class MessagesRequest(Conversation):
    """POST /v1/messages."""

    max_tokens: Annotated[int, Field(ge=1, le=2**31 - 1)]
    stop_sequences: list[Text] | None = None
    temperature: Annotated[float, within(BOUNDS["temperature"], high=1)] | None = None  # Anthropic's 0-1
    top_p: Annotated[float, within(BOUNDS["top_p"])] | None = None
    top_k: Annotated[Int32, within(BOUNDS["top_k"])] | None = None
    stream: StrictBool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: nothing to choose

    def to_sampling(self) -> Sampling:
        """The Generate sampling settings: the fields Sampling names alike, by name (a new setting is a
        field here and nothing else), and the ones this API names otherwise from `renamed`."""
        values = {name: getattr(self, name) for name in _alike(type(self))}
        values.update(self.renamed())
        return Sampling.of(values)

    def renamed(self) -> dict[str, Any]:
        return {"stop": tuple(self.stop_sequences or ())}


class CountTokensRequest(Conversation):
    """POST /v1/messages/count_tokens."""


@cache
def _alike(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(sorted(SAMPLING_FIELDS & set(model.model_fields)))
