"""The one pooled gRPC channel to the server: keepalive, message sizes, and the service config whose
retry policy retries only UNAVAILABLE and only on the safe unary methods (AIP-194)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from sluice.inference.v1 import inference_pb2_grpc
from starlette.requests import HTTPConnection

from shim.config import ShimSettings

INFERENCE_SERVICE = "sluice.inference.v1.InferenceService"
RETRIED_METHODS = ("Infer", "ListModels", "GetModel")

# Generate is deliberately absent: a stream must never be replayed once a token may have been seen.
SERVICE_CONFIG: dict[str, Any] = {
    "methodConfig": [
        {
            "name": [{"service": INFERENCE_SERVICE, "method": method} for method in RETRIED_METHODS],
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.05s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}


def channel_options(settings: ShimSettings) -> list[tuple[str, str | int]]:
    return [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        # A minute is well above gRPC's default server ping policy, and it still notices a dead
        # upstream behind a silent load balancer during a long generation.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
    ]


@dataclass(frozen=True, slots=True)
class Upstream:
    """The channel and the stubs bound to it, shared by every request for the app's lifetime."""

    channel: grpc.aio.Channel
    inference: inference_pb2_grpc.InferenceServiceAsyncStub
    health: Any  # grpc_health ships no stubs for health_pb2_grpc.

    async def close(self) -> None:
        await self.channel.close(grace=None)


def open_upstream(settings: ShimSettings) -> Upstream:
    """Opens the channel; it connects lazily, so a down server fails calls, not start-up."""
    channel = grpc.aio.insecure_channel(settings.upstream, options=channel_options(settings))
    return Upstream(
        channel=channel,
        inference=inference_pb2_grpc.InferenceServiceStub(channel),
        health=health_pb2_grpc.HealthStub(channel),
    )


def upstream_of(connection: HTTPConnection) -> Upstream:
    """The Upstream the lifespan stored on the app."""
    upstream: Upstream = connection.app.state.upstream
    return upstream


def settings_of(connection: HTTPConnection) -> ShimSettings:
    settings: ShimSettings = connection.app.state.settings
    return settings
