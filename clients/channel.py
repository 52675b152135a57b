"""The one channel policy, shared by the sync and asyncio clients and the shim: keepalive, message size,
reconnect back-off, retry policy, and balancing over replicas.

Retries follow AIP-194: the channel's service config retries only UNAVAILABLE, and only for the safe
unary methods, after the server's pushback (`grpc-retry-pushback-ms`) where it sends one. Generate is
never retried, because a stream that already produced tokens cannot be replayed without duplicating them.

A target naming several replicas (clients/targets.py) is balanced round_robin over those whose
`sluice.readiness` health service says SERVING (gRPC's client-side health checking): a replica that is
full, breaker-open or draining stops receiving new calls. One server is never health-checked by the
channel: its own refusal (QUEUE_FULL with a retry delay) says more than a channel with no ready backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from clients.targets import resolve_target
from wire.metadata import INFERENCE_SERVICE, READINESS_SERVICE

__all__ = [
    "SERVICE_NAME",
    "ChannelSettings",
    "channel_options",
    "check_timeout",
    "open_aio_channel",
    "open_channel",
    "service_config",
    "tls_credentials",
]

SERVICE_NAME = INFERENCE_SERVICE
_RETRIED_METHODS = ("Infer", "ListModels", "GetModel")

ChannelOption = tuple[str, str | int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelSettings:
    """How the client's channel behaves; the defaults suit a server on the same network."""

    # Tensors of a few MiB are routine; the gRPC default of 4 MiB is too tight for them.
    max_message_bytes: int = 64 * 1024 * 1024
    # Pings find a replica that stopped answering (a frozen process, a vanished host) while calls are in
    # flight: a stream on it ends UNAVAILABLE within time + timeout instead of hanging. The server allows
    # pings this often (server/transport/options.py).
    keepalive_time_s: float = 10.0
    keepalive_timeout_s: float = 5.0
    retry_max_attempts: int = 4
    retry_initial_backoff_s: float = 0.1
    retry_max_backoff_s: float = 2.0
    retry_backoff_multiplier: float = 2.0
    # gRPC's own reconnect back-off grows to 120 s: a server back from a restart would wait up to two
    # minutes for its callers' channels. One second is cheap against a server on the same network.
    reconnect_backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be positive, got {self.max_message_bytes}")
        if self.keepalive_time_s <= 0 or self.keepalive_timeout_s <= 0:
            raise ValueError("keepalive_time_s and keepalive_timeout_s must be positive")
        # gRPC ignores a retry policy with fewer than 2 attempts and caps attempts at 5 anyway.
        if not 2 <= self.retry_max_attempts <= 5:
            raise ValueError(f"retry_max_attempts must be between 2 and 5, got {self.retry_max_attempts}")
        if self.retry_initial_backoff_s <= 0 or self.retry_max_backoff_s <= 0:
            raise ValueError("retry backoffs must be positive")
        if self.retry_backoff_multiplier <= 0:
            raise ValueError("retry_backoff_multiplier must be positive")
        if not self.reconnect_backoff_s > 0:
            raise ValueError(f"reconnect_backoff_s must be positive, got {self.reconnect_backoff_s}")


def service_config(settings: ChannelSettings, *, balanced: bool = False) -> str:
    """The service config JSON: retry UNAVAILABLE for the unary methods, nothing for Generate; over
    several replicas, round_robin among the healthy ones."""
    config: dict[str, Any] = {
        "methodConfig": [
            {
                "name": [{"service": SERVICE_NAME, "method": method} for method in _RETRIED_METHODS],
                "retryPolicy": {
                    "maxAttempts": settings.retry_max_attempts,
                    "initialBackoff": f"{settings.retry_initial_backoff_s}s",
                    "maxBackoff": f"{settings.retry_max_backoff_s}s",
                    "backoffMultiplier": settings.retry_backoff_multiplier,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    if balanced:
        config["loadBalancingConfig"] = [{"round_robin": {}}]
        config["healthCheckConfig"] = {"serviceName": READINESS_SERVICE}
    return json.dumps(config)


def channel_options(settings: ChannelSettings, *, balanced: bool = False) -> list[ChannelOption]:
    """The grpc channel arguments for `settings`, identical for sync and aio channels."""
    backoff_ms = max(1, int(settings.reconnect_backoff_s * 1000))
    return [
        # Every wait between connection attempts is the back-off (gRPC adds 20% jitter); the minimum
        # is also how long one attempt may take, which bounds a connect to a silent address.
        ("grpc.initial_reconnect_backoff_ms", backoff_ms),
        ("grpc.min_reconnect_backoff_ms", backoff_ms),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.keepalive_time_ms", int(settings.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        # Idle connections are not pinged: servers count such pings as abuse and send GOAWAY.
        ("grpc.keepalive_permit_without_calls", 0),
        # A call queued on the server sends no data for a while: keep pinging it (gRPC stops after 2).
        ("grpc.http2.max_pings_without_data", 0),
        # Any ping unanswered this long ends the transport. gRPC's own waits 60 s, and a flow-control (BDP)
        # ping already in flight holds the keepalive ping back: a frozen replica's stream hung 60 s.
        ("grpc.http2.ping_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(settings, balanced=balanced)),
    ]


def tls_credentials(
    ca: str | Path | None = None, *, cert: str | Path | None = None, key: str | Path | None = None
) -> grpc.ChannelCredentials:
    """TLS to the server: `ca` the PEM CA its certificate chains to (None: the system's roots); `cert` and
    `key` this client's own certificate and key, where the server requires one (mTLS)."""
    if (cert is None) != (key is None):
        raise ValueError("cert and key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes() if ca is not None else None,
        private_key=Path(key).read_bytes() if key is not None else None,
        certificate_chain=Path(cert).read_bytes() if cert is not None else None,
    )


def open_channel(
    target: str, settings: ChannelSettings, credentials: grpc.ChannelCredentials | None
) -> grpc.Channel:
    """A sync channel to `target` (clients/targets.py), TLS when `credentials` are given."""
    resolved = resolve_target(target)
    options = channel_options(settings, balanced=resolved.balanced)
    if credentials is None:
        return grpc.insecure_channel(resolved.grpc_target, options=options)
    return grpc.secure_channel(resolved.grpc_target, credentials, options=options)


def open_aio_channel(
    target: str,
    settings: ChannelSettings,
    credentials: grpc.ChannelCredentials | None,
    interceptors: Sequence[Any] | None = None,  # aio.ClientInterceptor (its stubs are partial)
) -> aio.Channel:
    """An asyncio channel to `target` (clients/targets.py), TLS when `credentials` are given."""
    resolved = resolve_target(target)
    options = channel_options(settings, balanced=resolved.balanced)
    if credentials is None:
        return aio.insecure_channel(resolved.grpc_target, options=options, interceptors=interceptors)
    return aio.secure_channel(resolved.grpc_target, credentials, options=options, interceptors=interceptors)


def check_timeout(timeout: float | None) -> float | None:
    """Validate a per-call deadline in seconds (None: no deadline), as both clients accept it."""
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive seconds or None, got {timeout}")
    return timeout
