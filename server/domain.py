"""Domain types shared by the servicer, the batchers and the runtimes; nothing here knows about gRPC."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from server.priority import Priority as Priority  # re-exported: the codec and the scheduler name it here
from wire.constraint import Constraint, Tool, ToolCall, ToolChoice
from wire.sampling import DEFAULTS as SAMPLING_DEFAULTS
from wire.sampling import FIELDS as SAMPLING_FIELDS
from wire.sampling import Sampling


class DType(enum.Enum):
    """Element types a tensor may have, with their little-endian numpy equivalents."""

    FLOAT32 = "<f4"
    FLOAT64 = "<f8"
    FLOAT16 = "<f2"
    INT32 = "<i4"
    INT64 = "<i8"
    BOOL = "|b1"
    STRING = "O"

    @property
    def numpy(self) -> np.dtype[np.generic]:
        return _NUMPY_DTYPES[self]  # built once: np.dtype(str) per tensor was a measurable part of a call


_NUMPY_DTYPES: dict[DType, np.dtype[np.generic]] = {d: np.dtype(d.value) for d in DType}


class ModelKind(enum.Enum):
    TENSOR = "tensor"
    GENERATIVE = "generative"


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"
    TOOL_CALLS = "tool_calls"


Array = npt.NDArray[np.generic]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a tensor model; -1 marks a variable dimension."""

    name: str
    dtype: DType
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelLimits:
    max_batch_size: int
    context_length: int = 0
    max_tokens: int = 0
    max_concurrent_sequences: int = 0


@dataclass(frozen=True, slots=True)
class ModelDescriptor:
    """What ListModels and GetModel report about a model."""

    name: str
    version: str
    kind: ModelKind
    description: str
    limits: ModelLimits
    device: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    dtype: str = ""  # the weights' dtype where the model has one (float32, bfloat16)
    quantization: str = "none"  # weight-only: none, int8 or int4 (docs/quantization.md)


@dataclass(frozen=True, slots=True)
class InferItem:
    """One Infer request after decoding: named inputs without the batch dimension."""

    model: str
    inputs: dict[str, Array]
    priority: Priority = Priority.NORMAL
    request_id: str = ""
    typed_outputs: bool = False


@dataclass(frozen=True, slots=True)
class InferResult:
    outputs: dict[str, Array]
    model_version: str
    queue_wait_s: float
    compute_s: float
    batch_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams(Sampling):
    """A request's Sampling resolved by the scheduler: max_tokens decided (against the model's limits and
    the prompt), every unset field at the default wire/sampling.py declares. A new setting never comes
    here: the fields below are only narrowed from `X | None`, for the scheduler's Python arithmetic on
    them (a setting the sampler reads as a tensor needs nothing)."""

    max_tokens: int
    temperature: float = SAMPLING_DEFAULTS["temperature"]
    min_tokens: int = SAMPLING_DEFAULTS["min_tokens"]
    presence_penalty: float = SAMPLING_DEFAULTS["presence_penalty"]
    frequency_penalty: float = SAMPLING_DEFAULTS["frequency_penalty"]
    repetition_penalty: float = SAMPLING_DEFAULTS["repetition_penalty"]

    def __post_init__(self) -> None:
        for name, default in SAMPLING_DEFAULTS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)  # frozen: set once, while constructing

    @classmethod
    def resolved(cls, asked: Sampling, *, max_tokens: int) -> SamplingParams:
        return cls(
            **{name: getattr(asked, name) for name in SAMPLING_FIELDS - {"max_tokens"}}, max_tokens=max_tokens
        )


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message of a conversation; role is system, user, assistant or tool."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str = ""  # the call a tool turn answers
    name: str = ""


@dataclass(frozen=True, slots=True)
class GenerateSpec:
    """One Generate request after decoding; exactly one of prompt_text / prompt_ids / prompt_chat is set."""

    model: str
    prompt_text: str | None
    prompt_ids: tuple[int, ...] | None
    prompt_chat: tuple[ChatTurn, ...] | None = None
    # As asked (frozen, so one default instance is safe); the scheduler resolves the defaults.
    sampling: Sampling = Sampling()  # noqa: RUF009
    priority: Priority = Priority.NORMAL
    request_id: str = ""
    constraint: Constraint | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice("none")  # noqa: RUF009 (frozen)
    parallel_tool_calls: bool = True


@dataclass(frozen=True, slots=True)
class TokenizeSpec:
    """One Tokenize request after decoding: exactly one of text / chat is set."""

    model: str
    text: str | None
    chat: tuple[ChatTurn, ...] | None = None
    tools: tuple[Tool, ...] = ()
    add_special_tokens: bool = False
    add_generation_prompt: bool = True


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class GenerateTimings:
    """Where one generation spent its time on the server, in seconds (the contract's GenerateTimings)."""

    queue_wait_s: float  # arrival to the first scheduled step: admission, then the wait to join the batch
    time_to_first_token_s: float  # arrival to the first token (0: none came)
    decode_s: float  # first token to last
    tokens: int
    first_step: int  # the scheduler step that began its prefill (-1: it never joined)
    batch_size: int  # sequences in that step


@dataclass(frozen=True, slots=True)
class StreamError:
    """The error that ended a stream after it had started (code is a canonical status name)."""

    code: str
    message: str
    reason: str


@dataclass(frozen=True, slots=True)
class TokenProbability:
    """A token with its natural-log probability under the model (before temperature)."""

    token_id: int
    token: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The chosen token's log-probability and the likeliest alternatives at its position."""

    chosen: TokenProbability
    top: tuple[TokenProbability, ...]


@dataclass(slots=True)
class TokenChunk:
    """New output of one sequence since the last chunk; the last chunk carries the finish reason."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token id, when asked for
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: StreamError | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # on the last chunk, with finish_reason TOOL_CALLS
    timings: GenerateTimings | None = None
    stop_sequence: str = ""  # on the last chunk, where one of the request's stop sequences ended it
