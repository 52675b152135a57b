"""Whether a call comes from the server's own host: the one test shared memory puts a caller to, since a
region names an object in this host's /dev/shm and only a process here could have made it.

How the peer is known: gRPC's `context.peer()`, the address of the socket the call arrived on, as the kernel
gave it to accept() (it cannot be set by the caller). `unix:` (a Unix socket) and a loopback address
(127.0.0.0/8, ::1, ::ffff:127.x) are this host; anything else, or no peer at all (a front-end process
forwards the bytes without the address, server/frontends/), is not. A proxy on this host (the shim,
Envoy) makes every caller it forwards look local, so a local peer's `x-forwarded-for` is read too: every
address it names must be loopback as well. A remote caller cannot use that header to pass (its own peer is
not local); a local one can only make itself look remote."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from wire.metadata import FORWARDED_FOR


def remote_address(peer: str | None, metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The first address on the call's way that is not this host's, or None when every one is local."""
    if not peer or not is_local(peer):
        return peer or "unknown (no peer address)"
    for key, value in metadata:
        if key == FORWARDED_FOR:
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            for address in text.split(","):
                if not _loopback(address.strip()):
                    return address.strip() or "an empty x-forwarded-for entry"
    return None


def is_local(peer: str) -> bool:
    """A gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:/run/s.sock`) on this host."""
    kind, _, rest = peer.partition(":")
    if kind in ("unix", "unix-abstract"):
        return True
    if kind == "ipv4":
        return _loopback(rest.rpartition(":")[0])
    if kind == "ipv6":
        return _loopback(rest.rpartition(":")[0].removeprefix("[").removesuffix("]"))
    return False


def _loopback(address: str) -> bool:
    """An IP address (an x-forwarded-for entry may carry a port or brackets) that is loopback."""
    if address.startswith("[") and "]" in address:  # [::1]:5000
        address = address[1 : address.index("]")]
    elif address.count(":") == 1:  # 127.0.0.1:5000
        address = address.partition(":")[0]
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return False  # a name, or garbage: not provably this host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
