"""The request bodies of the OpenAI routes, as the official SDKs send them. A parameter Sluice cannot honour
(the deprecated `functions`, `echo`, ...) is refused naming it, never silently ignored; one the API does
not know is refused too. Structured outputs, tools and logits settings are in structured.py."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from shim.openai.structured import (
    NamedToolChoice,
    ParamError,
    Shaping,
    ToolParam,
)
from shim.proto_values import Int32, Text, UInt64, within
from wire.sampling import BOUNDS, MAX_LOGPROBS, Sampling
from wire.sampling import FIELDS as SAMPLING_FIELDS

MAX_N = 16  # choices per request: each is a stream of its own

Seed = UInt64
Probability = Annotated[float, within(BOUNDS["top_p"])]
Temperature = Annotated[float, within(BOUNDS["temperature"], high=2)]  # OpenAI's API stops at 2
# How many stop sequences a request may give is the server's setting (--max-stop-sequences): it refuses more
# (400, `param: stop`), so the limit is checked once, where it is configured.
Stop = Text | list[Text] | None


class Unsupported(ValueError):
    """A parameter Sluice does not honour; `param` names it for the error's `param` field."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param} is not supported: {why}")
        self.param = param


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user: Text | None = None  # forwarded to the server's access log


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_usage: StrictBool = False


class _Sampling(Shaping, _Body):
    """What completions and chat share; top_k, min_tokens, ignore_eos and the guided_* fields are vLLM's
    extras."""

    model: Text = Field(min_length=1)
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: Stop = None
    seed: Seed | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    top_k: Int32 | None = None
    min_tokens: Int32 | None = None
    ignore_eos: StrictBool = False

    def to_sampling(self, *, choice: int = 0) -> Sampling:
        """The Generate sampling settings of one choice: the fields Sampling names alike, by name (a new
        setting is a field here and nothing else); the ones this API names otherwise from `renamed`; each
        choice its own seed."""
        values = {name: getattr(self, name) for name in _alike(type(self))}
        values.update(self.renamed())
        if self.seed is not None:
            values["seed"] = (self.seed + choice) % 2**64
        return Sampling.of(values)

    def renamed(self) -> dict[str, Any]:
        """Sampling fields this route names or shapes otherwise than the Generate request does."""
        return {}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


@cache
def _alike(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(sorted(SAMPLING_FIELDS & set(model.model_fields)))


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text"]
    text: Text


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text
    arguments: Text


class AssistantToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: Text | None = None
    refusal: Text | None = None  # what the SDK echoes back of an assistant turn

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required, except in an assistant message with tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: Annotated[list[ToolParam], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: StrictBool | None = None

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        if self.functions:
            raise Unsupported("functions", "the deprecated functions; send tools")
        if self.function_call not in (None, "none"):
            raise Unsupported("function_call", "the deprecated function_call; send tool_choice")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ParamError("tool_choice", "tool_choice needs tools")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ParamError("tools", "tool names must be unique")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            chosen = self.tool_choice.function.name
            raise ParamError("tool_choice", f"tool_choice names {chosen!r}, which is not among the tools")
        self.constraint()  # refuses two constraints at once, while parsing
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def renamed(self) -> dict[str, Any]:
        # max_completion_tokens is the newer name of max_tokens; logprobs is a switch, top_logprobs the count.
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return {"max_tokens": limit, "logprobs": (self.top_logprobs or 0) if self.logprobs else None}


# A prompt is text, a list of texts, token ids, or a list of token-id lists.
TokenIds = Annotated[list[Int32], Field(min_length=1)]
Prompt = (
    Text
    | Annotated[list[Text], Field(min_length=1)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1)]
)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: Int32 | None = 16  # OpenAI's default for completions
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False
    suffix: Text | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _refuse_options(self) -> CompletionRequest:
        self.constraint()
        if self.echo:
            raise Unsupported("echo", "the prompt is not returned")
        if self.suffix:
            raise Unsupported("suffix", "insertion")
        if self.best_of not in (None, self.n):
            raise Unsupported("best_of", "best_of must equal n")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a text or a token-id list."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(token, int) for token in prompt):
            return [[token for token in prompt if isinstance(token, int)]]
        return [entry for entry in prompt if not isinstance(entry, int)]


class EmbeddingRequest(_Body):
    """POST /v1/embeddings (text inputs: the served encoders tokenize themselves)."""

    model: Text = Field(min_length=1)
    input: Text | Annotated[list[Text], Field(min_length=1, max_length=2048)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int32 | None = None

    @model_validator(mode="after")
    def _refuse_dimensions(self) -> EmbeddingRequest:
        if self.dimensions is not None:
            raise Unsupported("dimensions", "a model's vectors have the size it was trained with")
        return self

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
