"""The one pooled gRPC channel to the server, opened with the clients' channel policy (clients.channel:
keepalive, message sizes, reconnect back-off, and retries of UNAVAILABLE on the safe unary methods)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from sluice.inference.v1 import inference_pb2_grpc
from starlette.requests import HTTPConnection

from clients.channel import ChannelSettings, open_aio_channel, tls_credentials
from shim.config import ShimSettings
from shim.upstream.forwarding import forwarding_interceptors
from shim.upstream.routing import Routing, open_routing


def channel_settings(settings: ShimSettings) -> ChannelSettings:
    """The clients' channel policy, with the sizes and back-off the shim's settings choose."""
    return ChannelSettings(
        max_message_bytes=settings.max_message_bytes, reconnect_backoff_s=settings.reconnect_backoff_s
    )


@dataclass(frozen=True, slots=True)
class Upstream:
    """The channel and the stubs bound to it, shared by every request for the app's lifetime."""

    channel: grpc.aio.Channel
    inference: inference_pb2_grpc.InferenceServiceAsyncStub
    health: Any  # grpc_health ships no stubs for health_pb2_grpc.
    routing: Routing  # where each Generate call goes (--routing)

    async def close(self) -> None:
        await self.routing.close()
        await self.channel.close(grace=None)


def open_upstream(settings: ShimSettings, *, trace_context: bool = False, routed: Any = None) -> Upstream:
    """Opens the channel; it connects lazily, so a down server fails calls, not start-up. With
    `trace_context` (tracing on: the flag or OTEL_EXPORTER_OTLP_*) calls carry the shim's span; `routed`
    counts prefix routing's choices. Runs in the serving event loop (a routing policy may start tasks)."""
    credentials = None
    if settings.upstream_ca is not None:
        credentials = tls_credentials(
            settings.upstream_ca, cert=settings.upstream_cert, key=settings.upstream_key
        )
    # With --auth-keys each call carries the token of the request it serves (interceptors cost ~20 us a call,
    # so a shim without keys adds none).
    interceptors = forwarding_interceptors(token=settings.auth_keys is not None, trace_context=trace_context)
    channel = open_aio_channel(
        settings.upstream, channel_settings(settings), credentials, interceptors or None
    )
    inference = inference_pb2_grpc.InferenceServiceStub(channel)

    def replica_channel(address: str) -> grpc.aio.Channel:
        return open_aio_channel(address, channel_settings(settings), credentials, interceptors or None)

    return Upstream(
        channel=channel,
        inference=inference,
        health=health_pb2_grpc.HealthStub(channel),
        routing=open_routing(settings, inference, replica_channel, routed),
    )


def upstream_of(connection: HTTPConnection) -> Upstream:
    """The Upstream the lifespan stored on the app."""
    upstream: Upstream = connection.app.state.upstream
    return upstream


def settings_of(connection: HTTPConnection) -> ShimSettings:
    settings: ShimSettings = connection.app.state.settings
    return settings
