"""The grpc.aio server options of every process that holds the gRPC port (the server, or its front ends):
message limits, connection caps and the connection lifetimes that keep one peer from holding the port; and
the check, before grpc binds, that the port is free."""

from __future__ import annotations

import socket

from server.config import Settings

BUSY_PORT = "invalid setting port: cannot listen on {address}; choose a free --port, or 0"


def server_options(settings: Settings, max_connections: int, *, share_port: bool) -> list[tuple[str, int]]:
    """`share_port`: front ends bind one port together (SO_REUSEPORT); a lone server never shares it,
    so a second server on the same port fails to bind instead of silently taking half the calls."""
    limit = 2 * settings.max_message_bytes  # between 1x and 2x the servicer answers with ErrorInfo
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 1 if share_port else 0),
        ("grpc.max_allowed_incoming_connections", max_connections),
        # A socket that never starts HTTP/2 holds a descriptor and a connection place: close it.
        ("grpc.server_handshake_timeout_ms", int(settings.handshake_timeout_s * 1000)),
        # One peer cannot hold the port: streams per connection are bounded, idle connections closed, and
        # old ones asked to reconnect (GOAWAY) with a grace long enough for a generation.
        ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
        # gRPC's overload protection (on by default) also counts streams that HTTP/2 has closed but whose
        # call objects Python has not yet freed, and resets new ones with REFUSED_STREAM: a peer that keeps
        # exactly SETTINGS_MAX_CONCURRENT_STREAMS open, as a pooled channel does, saw thousands of resets
        # a second. With it off, only open HTTP/2 streams count, which is what the setting promises.
        ("grpc.http.overload_protection", 0),
        ("grpc.max_connection_idle_ms", int(settings.max_connection_idle_s * 1000)),
        ("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(settings.max_connection_age_grace_s * 1000)),
        # Clients ping every 10 s while calls are in flight to find a replica that stopped answering
        # (clients/channel.py); gRPC's default (5 min without data) would answer a queued call's pings
        # with GOAWAY too_many_pings.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ]


def check_free(host: str, port: int) -> None:
    """Refuses a busy port in one line, before grpc tries it (and logs its own error lines)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds: TIME_WAIT is no obstacle
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"invalid setting port: cannot listen on {host}:{port} ({exc.strerror}); "
                "choose a free --port, or 0"
            ) from exc
