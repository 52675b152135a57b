"""The shim's one frozen configuration object, and the command-line parsing that builds it."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

_MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ShimSettings:
    """Everything the shim needs, decided once at start-up and passed down."""

    upstream: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = _MIB
    max_inflight: int = 512
    infer_timeout_s: float = 60.0
    generate_timeout_s: float = 600.0
    sse_heartbeat_s: float = 15.0
    # Accepted for operators' configs; the SSE path pulls one gRPC message per event, so it never needs
    # more than one message of read-ahead and this only bounds future buffering.
    stream_buffer_events: int = 16
    ready_timeout_s: float = 2.0
    max_message_bytes: int = 64 * _MIB
    graceful_shutdown_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.upstream.strip():
            raise ValueError("upstream must be a non-empty gRPC target such as 127.0.0.1:50051")
        if not self.host.strip():
            raise ValueError("host must be a non-empty interface address")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        for name in ("max_body_bytes", "max_inflight", "stream_buffer_events", "max_message_bytes"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name in (
            "infer_timeout_s",
            "generate_timeout_s",
            "sse_heartbeat_s",
            "ready_timeout_s",
            "graceful_shutdown_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> ShimSettings:
        """Parses command-line flags; invalid values raise ValueError naming the setting."""
        defaults = cls()
        parser = argparse.ArgumentParser(prog="python -m shim", description="Sluice HTTP/SSE shim")
        parser.add_argument("--upstream", default=defaults.upstream, help="gRPC server target host:port")
        parser.add_argument("--host", default=defaults.host, help="HTTP interface to bind")
        parser.add_argument("--port", type=int, default=defaults.port, help="HTTP port; 0 picks a free one")
        parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
        parser.add_argument("--max-inflight", type=int, default=defaults.max_inflight)
        parser.add_argument("--infer-timeout-s", type=float, default=defaults.infer_timeout_s)
        parser.add_argument("--generate-timeout-s", type=float, default=defaults.generate_timeout_s)
        parser.add_argument("--sse-heartbeat-s", type=float, default=defaults.sse_heartbeat_s)
        parser.add_argument("--stream-buffer-events", type=int, default=defaults.stream_buffer_events)
        parser.add_argument("--ready-timeout-s", type=float, default=defaults.ready_timeout_s)
        parser.add_argument("--max-message-bytes", type=int, default=defaults.max_message_bytes)
        parser.add_argument("--graceful-shutdown-s", type=float, default=defaults.graceful_shutdown_s)
        args = parser.parse_args(argv)
        return cls(
            upstream=args.upstream,
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            max_inflight=args.max_inflight,
            infer_timeout_s=args.infer_timeout_s,
            generate_timeout_s=args.generate_timeout_s,
            sse_heartbeat_s=args.sse_heartbeat_s,
            stream_buffer_events=args.stream_buffer_events,
            ready_timeout_s=args.ready_timeout_s,
            max_message_bytes=args.max_message_bytes,
            graceful_shutdown_s=args.graceful_shutdown_s,
        )
