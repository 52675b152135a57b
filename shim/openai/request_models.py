"""The request bodies of the OpenAI routes, as the official SDKs send them. A parameter Sluice cannot honour
(tools, response formats other than text, penalties other than 0, ...) is refused naming it, never
silently ignored; one the API does not know is refused too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from shim.proto_values import Int32, Text, UInt64

MAX_LOGPROBS = 5  # the server's bound on alternatives per token
MAX_N = 16  # choices per request: each is a stream of its own

Seed = UInt64
Probability = Annotated[float, Field(gt=0, le=1)]
Temperature = Annotated[float, Field(ge=0, le=2)]
Stop = Text | Annotated[list[Text], Field(max_length=4)] | None


class Unsupported(ValueError):
    """A parameter Sluice does not honour; `param` names it for the error's `param` field."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param} is not supported: {why}")
        self.param = param


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Accepted, and refused unless they ask for nothing Sluice would ignore.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: Text | None = None  # forwarded to the server's access log

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> Any:
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise Unsupported(name, "penalties other than 0")
        if self.logit_bias:
            raise Unsupported("logit_bias", "token biases")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_usage: StrictBool = False


class _Sampling(_Body):
    """What completions and chat share; top_k, min_tokens and ignore_eos are vLLM's extras."""

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

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: Text | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: StrictBool | None = None

    @model_validator(mode="after")
    def _refuse_tools(self) -> ChatCompletionRequest:
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise Unsupported(name, "this server calls no tools")
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none"):
                raise Unsupported(name, "this server calls no tools")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise Unsupported("response_format", "only {'type': 'text'}")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def alternatives(self) -> int | None:
        """Log-probability alternatives per token to ask the server for (None: no log-probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None


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
