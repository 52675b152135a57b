"""The shim's one frozen configuration object; its command-line flags are generated from the fields
(process.flags), so a flag's name, type, default and help text cannot drift from the setting."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

from process.flags import add_flags, setting, values_from

_MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ShimSettings:
    """Everything the shim needs, decided once at start-up and passed down."""

    upstream: str = setting(
        "127.0.0.1:50051",
        help="gRPC server target: host:port, replicas as host:port,host:port, or dns:///name:port",
        unit="target",
    )
    upstream_ca: str | None = setting(
        None, help="PEM CA the upstream server's certificate chains to; TLS to the upstream when set",
        shown="plaintext",
    )  # fmt: skip
    upstream_cert: str | None = setting(
        None, help="PEM client certificate for an mTLS upstream", shown="none"
    )
    upstream_key: str | None = setting(None, help="PEM private key of --upstream-cert", shown="none")
    access_log: float = setting(
        0.0,
        help="fraction of API requests written as one JSON line on stderr; 1 = every one",
        unit="fraction",
    )
    auth_keys: str | None = setting(
        None, help="TOML keys file (as the server's): API requests need a bearer token from it",
        shown="no authentication",
    )  # fmt: skip
    tls_cert: str | None = setting(
        None, help="PEM certificate of the HTTP port; HTTPS when set", shown="HTTP"
    )
    tls_key: str | None = setting(None, help="PEM private key of --tls-cert", shown="none")
    host: str = setting("127.0.0.1", help="HTTP interface to bind")
    port: int = setting(8000, help="HTTP port; 0 picks a free one")
    workers: int = setting(
        1,
        help="shim processes serving the one port, each with its own event loop and pooled gRPC channel; "
        "max-inflight and max-connections hold per process",
        unit="processes",
    )
    max_body_bytes: int = setting(
        _MIB, help="largest request body accepted; a larger one is refused with 413", unit="bytes"
    )
    max_inflight: int = setting(
        512, help="API requests served at once; more are refused with 503 SHIM_OVERLOADED", unit="requests"
    )
    max_connections: int | None = setting(
        None,
        help="HTTP connections held at once; at the cap the longest-idle one is closed to admit a new one; "
        "derived from the descriptor limit when unset",
        unit="connections",
    )
    # Timeouts against slow or silent clients, as nginx's client_header_timeout, client_body_timeout
    # and keepalive_timeout (uvicorn has no header or body timeout of its own).
    header_timeout_s: float = setting(
        10.0, help="time from a request's first byte to the end of its headers; then 408", unit="seconds"
    )
    body_timeout_s: float = setting(
        30.0, help="time to receive a whole request body once its headers are in; then 408", unit="seconds"
    )
    idle_timeout_s: float = setting(
        5.0, help="how long a connection may wait silent for its next request, or its first", unit="seconds"
    )
    infer_timeout_s: float = setting(60.0, help="deadline of an upstream Infer call", unit="seconds")
    generate_timeout_s: float = setting(600.0, help="deadline of an upstream Generate call", unit="seconds")
    sse_heartbeat_s: float = setting(
        15.0, help="interval of `: ping` comments on a quiet SSE stream", unit="seconds"
    )
    ready_timeout_s: float = setting(
        2.0, help="deadline of the upstream health check of /readyz", unit="seconds"
    )
    reconnect_backoff_s: float = setting(
        1.0,
        help="longest wait between attempts to reconnect to the upstream; gRPC's own grows to 120 s",
        unit="seconds",
    )
    max_message_bytes: int = setting(64 * _MIB, help="largest gRPC message sent or received", unit="bytes")
    graceful_shutdown_s: float = setting(
        10.0, help="time in-flight requests get to finish on SIGTERM", unit="seconds"
    )
    cors_allow_origins: tuple[str, ...] = setting(
        (),
        help="origins allowed to call the API from a browser, comma-separated, or *; none: no CORS headers",
    )
    routing: str = setting(
        "round_robin",
        help="how Generate calls spread over the replicas: round_robin (the channel's own), or prefix (to "
        "the replica that was sent the prompt's prefix, unless it is loaded past --routing-imbalance)",
    )
    routing_block_bytes: int = setting(
        64, help="prefix routing: the prompt's bytes are indexed in blocks of this size", unit="bytes"
    )
    routing_index_blocks: int = setting(
        65536, help="prefix routing: block hashes remembered per replica, least recently sent out first",
        unit="blocks",
    )  # fmt: skip
    routing_min_match: float = setting(
        0.5, help="prefix routing: a shorter match (a fraction of the prompt's blocks) goes to the least "
        "loaded replica",
        unit="fraction",
    )  # fmt: skip
    routing_imbalance: float = setting(
        2.0, help="prefix routing: the replica holding a prompt's prefix gives way to the least loaded only "
        "when its calls in flight (or time to first token) exceed this many times the least one's, and by "
        "a margin", unit="ratio",
    )  # fmt: skip
    routing_imbalance_calls: int = setting(
        8, help="prefix routing: ... and exceed the least loaded one's by more than this many calls (a "
        "move re-reads the whole prompt: a few calls' wait is cheaper)", unit="calls",
    )  # fmt: skip
    routing_imbalance_wait_s: float = setting(
        0.5, help="prefix routing: ... or its calls' time to first token exceeds the least one's by more "
        "than this (and --routing-imbalance times)", unit="seconds",
    )  # fmt: skip
    routing_probe_s: float = setting(
        1.0, help="prefix routing: interval of each replica's readiness check", unit="seconds"
    )
    otlp_endpoint: str | None = setting(
        None, help="OpenTelemetry collector (OTLP/gRPC, host:port or http(s)://host:port) traces are sent to",
        shown="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing",
    )  # fmt: skip
    otlp_sampling_ratio: float = setting(
        1.0, help="fraction of traces begun here (no traceparent came) that are sampled"
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.access_log <= 1.0:
            raise ValueError(f"access_log must be a fraction in [0, 1], got {self.access_log}")
        if not 0.0 <= self.otlp_sampling_ratio <= 1.0:
            raise ValueError(
                f"otlp_sampling_ratio must be a fraction in [0, 1], got {self.otlp_sampling_ratio}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if (self.upstream_cert is None) != (self.upstream_key is None):
            raise ValueError("upstream_cert and upstream_key go together")
        if self.upstream_cert is not None and self.upstream_ca is None:
            raise ValueError("upstream_cert needs upstream_ca (a client certificate is only sent over TLS)")
        if self.routing_block_bytes < 1 or self.routing_index_blocks < 1:
            raise ValueError("routing_block_bytes and routing_index_blocks must be at least 1")
        if not 0.0 <= self.routing_min_match <= 1.0:
            raise ValueError(f"routing_min_match must be a fraction in [0, 1], got {self.routing_min_match}")
        if not self.routing_imbalance_wait_s >= 0:
            raise ValueError(
                f"routing_imbalance_wait_s must be at least 0, got {self.routing_imbalance_wait_s}"
            )
        if self.routing_imbalance_calls < 0:
            raise ValueError(
                f"routing_imbalance_calls must be at least 0, got {self.routing_imbalance_calls}"
            )
        if not self.routing_imbalance >= 1.0:
            raise ValueError(f"routing_imbalance must be at least 1, got {self.routing_imbalance}")
        if not self.routing_probe_s > 0:
            raise ValueError(f"routing_probe_s must be positive, got {self.routing_probe_s}")
        if not self.upstream.strip():
            raise ValueError("upstream must be a non-empty gRPC target such as 127.0.0.1:50051")
        if not self.host.strip():
            raise ValueError("host must be a non-empty interface address")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        for name in ("workers", "max_body_bytes", "max_inflight", "max_message_bytes"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1 (or auto), got {self.max_connections}")
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "idle_timeout_s",
            "infer_timeout_s",
            "generate_timeout_s",
            "sse_heartbeat_s",
            "ready_timeout_s",
            "reconnect_backoff_s",
            "graceful_shutdown_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        for origin in self.cors_allow_origins:
            if origin != "*" and "://" not in origin:
                raise ValueError(
                    f"cors_allow_origins holds {origin!r}; give origins as scheme://host[:port], or *"
                )

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> ShimSettings:
        """Parses command-line flags; invalid values raise ValueError naming the setting."""
        parser = argparse.ArgumentParser(prog="sluice shim", description="Sluice HTTP/SSE shim")
        add_flags(parser, cls)
        return cls(**values_from(parser.parse_args(argv), cls))
