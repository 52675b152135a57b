"""The result types the clients return: plain dataclasses with no protobuf in them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import grpc
import numpy as np
import numpy.typing as npt

from wire.constraint import ToolCall

__all__ = [
    "DType",
    "FinishReason",
    "GenerationChunk",
    "InferResult",
    "ModelInfo",
    "ModelKind",
    "OutputValue",
    "ParameterScalar",
    "PriorityName",
    "StreamError",
    "TensorSpec",
    "Usage",
]

PriorityName: TypeAlias = Literal["low", "normal", "high"]
FinishReason: TypeAlias = Literal["length", "stop", "cancelled", "error", "tool_calls"]
# "unspecified" only appears if a server leaves the kind unset; it is reported rather than hidden.
ModelKind: TypeAlias = Literal["tensor", "generative", "unspecified"]
DType: TypeAlias = Literal["float32", "float64", "float16", "int32", "int64", "bool", "string", "unspecified"]
ParameterScalar: TypeAlias = bool | int | float | str
# A decoded output: an array for numeric tensors, a flat list for STRING tensors.
OutputValue: TypeAlias = npt.NDArray[np.generic] | list[str]


@dataclass(frozen=True, slots=True)
class InferResult:
    """The outputs of one Infer call, with the server's timings for it."""

    outputs: dict[str, OutputValue]
    model: str
    model_version: str
    queue_wait_s: float
    compute_s: float
    batch_size: int
    request_id: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one generation, reported on its last chunk."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # prompt tokens the server's prefix cache held (not computed again)


@dataclass(frozen=True, slots=True)
class StreamError:
    """The error that ended a stream after it had started (sent in-band, not as the call's status)."""

    code: grpc.StatusCode
    message: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of a conversation to continue; the model's chat template renders the prompt."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str = ""  # the call a tool turn answers
    name: str = ""


@dataclass(frozen=True, slots=True)
class TokenProbability:
    """A token, the bytes it stands for, and its natural-log probability under the model."""

    token_id: int
    token: bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability and the likeliest alternatives at its position."""

    chosen: TokenProbability
    top: list[TokenProbability]


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """One streamed piece of a generation; only the last has `finish_reason` and `usage` set."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: StreamError | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token id, when asked for
    tool_calls: tuple[ToolCall, ...] = ()  # on the last chunk, when finish_reason is "tool_calls"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a tensor model; -1 in `shape` marks a variable dimension."""

    name: str
    dtype: DType
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A loaded model's metadata and the limits a request must respect."""

    name: str
    version: str
    kind: ModelKind
    description: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int = 0
    context_length: int = 0
    max_tokens: int = 0
    max_concurrent_sequences: int = 0
    device: str = ""
    dtype: str = ""  # the weights' dtype, where the model says
    quantization: str = ""  # weight-only: none, int8 or int4 (empty from a server before issue 30)
    parent: str = ""  # a LoRA adapter's base model; empty for a model of its own
    lora_rank: int = 0  # a LoRA adapter's rank
