"""Sluice client libraries."""

from clients.aio import AsyncGenerationStream, AsyncSluiceClient
from clients.channel import ChannelSettings, tls_credentials
from clients.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    RequestCancelledError,
    ResourceExhaustedError,
    SluiceError,
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

__all__ = [
    "AsyncGenerationStream",
    "AsyncSluiceClient",
    "ChannelSettings",
    "ChatMessage",
    "DeadlineExceededError",
    "GenerationChunk",
    "GenerationStream",
    "InferResult",
    "InternalError",
    "InvalidArgumentError",
    "ModelInfo",
    "NotFoundError",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "SluiceClient",
    "SluiceError",
    "StreamError",
    "TensorSpec",
    "TokenLogprob",
    "TokenProbability",
    "UnavailableError",
    "Usage",
    "tls_credentials",
]
