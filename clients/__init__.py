"""Sluice client libraries."""

from clients.aio import AsyncGenerationStream, AsyncSluiceClient
from clients.channel import ChannelSettings, tls_credentials
from clients.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RequestCancelledError,
    ResourceExhaustedError,
    SluiceError,
    UnauthenticatedError,
    UnavailableError,
)
from clients.sync import GenerationStream, SluiceClient
from clients.types import (
    ChatMessage,
    GenerationChunk,
    InferResult,
    ModelInfo,
    StreamError,
    TensorSpec,
    TokenLogprob,
    TokenProbability,
    Usage,
)
from wire.constraint import Constraint, Tool, ToolCall, ToolChoice
from wire.sampling import Sampling

__all__ = [
    "AsyncGenerationStream",
    "AsyncSluiceClient",
    "ChannelSettings",
    "ChatMessage",
    "Constraint",
    "DeadlineExceededError",
    "GenerationChunk",
    "GenerationStream",
    "InferResult",
    "InternalError",
    "InvalidArgumentError",
    "ModelInfo",
    "NotFoundError",
    "PermissionDeniedError",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "Sampling",
    "SluiceClient",
    "SluiceError",
    "StreamError",
    "TensorSpec",
    "TokenLogprob",
    "TokenProbability",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "UnauthenticatedError",
    "UnavailableError",
    "Usage",
    "tls_credentials",
]
