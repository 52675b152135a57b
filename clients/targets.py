"""What a target string names: one server (`host:port`), several replicas (`host:port,host:port`), or a gRPC
name (`dns:///name:port`, a Kubernetes headless Service; `ipv4:`, `ipv6:`, `unix:`), and the gRPC target
that reaches them. Several replicas are balanced by the channel itself (clients/channel.py: round_robin and
client-side health checks), as gRPC intends; no balancer of our own."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "xds:")
_BALANCED_SCHEMES = ("dns:", "ipv4:", "ipv6:", "xds:")


@dataclass(frozen=True, slots=True)
class Target:
    grpc_target: str
    balanced: bool  # it may name several replicas: round_robin over the healthy ones


def resolve_target(target: str) -> Target:
    """Raises ValueError naming the target when an entry of a list is not `host:port`."""
    text = target.strip()
    if text.startswith(_SCHEMES):
        return Target(text, text.startswith(_BALANCED_SCHEMES))
    entries = [entry.strip() for entry in text.split(",")]
    if len(entries) == 1:
        return Target(text, False)  # one server: gRPC resolves the name itself, as before
    addresses = [_address(entry, target) for entry in entries]
    v4 = [a for a in addresses if ":" not in a[0]]
    v6 = [a for a in addresses if ":" in a[0]]
    if v4 and v6:
        raise ValueError(f"target {target!r}: mixes IPv4 and IPv6 replicas; a channel takes one family")
    if v4:
        return Target("ipv4:" + ",".join(f"{host}:{port}" for host, port in v4), True)
    return Target("ipv6:" + ",".join(f"[{host}]:{port}" for host, port in v6), True)


def _address(entry: str, target: str) -> tuple[str, int]:
    """`host:port` as (IP literal, port); a host name is resolved once, here (dns:/// follows changes)."""
    host, sep, port_text = entry.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"target {target!r}: {entry!r} is not host:port")
    port = int(port_text)
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"target {target!r}: cannot resolve {host!r} ({exc.strerror})") from exc
    ips = [str(info[4][0]) for info in found]
    v4 = [ip for ip in ips if ":" not in ip]
    return (v4 or ips)[0], port
