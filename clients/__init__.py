"""Sluice client libraries."""

from clients.aio import AsyncGenerationStream, AsyncSluiceClient
from clients.channel import ChannelSettings
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
    GenerationChunk,
    InferResult,
    ModelInfo,
    StreamError,
    TensorSpec,
    Usage,
)

__all__ = [
    "AsyncGenerationStream",
    "AsyncSluiceClient",
    "ChannelSettings",
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
    "UnavailableError",
    "Usage",
]
