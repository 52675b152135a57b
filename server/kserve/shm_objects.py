"""SharedObject: one POSIX shared-memory object (`/dev/shm/<key>`) that a registered region reads from, and
which objects a caller may open at all.

Reads copy (pread) and are bounded by the object's size at the moment of the read: the object is never
mapped, so one that its owner truncates after registering gives the request a short read and an error
instead of the SIGBUS a mapping would raise in the server (the whole process, every caller's calls).

Which objects: a caller opens only objects named with its own prefix, `sluice-shm-<tenant>-` (with
--auth-keys; `sluice-shm-` for the one anonymous caller without it), and only a plain file with one name,
opened without following links: not another tenant's objects, not another program's (`/dev/shm/pulse-*`),
not the server's own front-end segments (`sluice-<hex>`), not a FIFO that would block the event loop."""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from server.errors import InvalidArgument, PermissionDenied, clip
from wire.errors import SHM_KEY_NOT_ALLOWED

PREFIX = "sluice-shm-"


def prefix_of(owner: str) -> str:
    """The object names a caller may register: its tenant's, or every Sluice one for the anonymous caller."""
    return f"{PREFIX}{owner}-" if owner else PREFIX


def check_tenants(names: Iterable[str]) -> None:
    """Raises ValueError where a tenant's name cannot be part of an object name, or where one tenant's prefix
    would take in another's objects (tenants `a` and `a-b`: `sluice-shm-a-` starts `sluice-shm-a-b-x`)."""
    prefixes = sorted((prefix_of(name), name) for name in names)
    for prefix, name in prefixes:
        if "/" in name or "\0" in name:
            raise ValueError(
                f"invalid setting kserve_shm: tenant {name!r} cannot name shared-memory objects "
                f"(its objects are {prefix}*): rename it or leave --kserve-shm off"
            )
    for (first, a), (second, b) in itertools.pairwise(prefixes):
        if second.startswith(first):
            raise ValueError(
                f"invalid setting kserve_shm: tenant {a!r}'s objects ({first}*) would include tenant {b!r}'s "
                f"({second}*): rename one of them or leave --kserve-shm off"
            )


@dataclass(slots=True)
class SharedObject:
    key: str
    fd: int
    size: int  # at registration; a read checks the size it finds then

    def read(self, start: int, size: int) -> memoryview | None:
        """`size` bytes from `start`, copied; None when the object no longer holds them (truncated)."""
        # os.pread fills a fresh bytes object (no zero-fill first): measured 1.1 ms for 4 MiB against
        # 1.3 ms for a bytearray and preadv, on a loaded 2-core EPYC.
        first = os.pread(self.fd, size, start)
        if len(first) == size:
            return memoryview(first)
        parts, done = [first], len(first)
        while done < size:  # short: the object's end, or one read's ~2 GiB limit on Linux
            chunk = os.pread(self.fd, size - done, start + done)
            if not chunk:
                return None
            parts.append(chunk)
            done += len(chunk)
        return memoryview(b"".join(parts))

    def current_size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)


def open_object(root: Path, key: str, owner: str) -> SharedObject:
    """The object `key` (`/name` or `name`, as tritonclient passes it) if `owner` may read it."""
    name = key.removeprefix("/")
    if not name or "/" in name or name in (".", ".."):
        raise InvalidArgument(f"key {clip(key)!r} is not a shared-memory object name", field="key")
    prefix = prefix_of(owner)
    if not name.startswith(prefix):
        raise PermissionDenied(
            f"key {clip(key)!r} is not yours to register: this caller's objects are named {prefix}*",
            reason=SHM_KEY_NOT_ALLOWED,
            metadata={"key": key, "prefix": prefix},
        )
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, on the event loop.
        fd = os.open(root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidArgument(
            f"no shared-memory object {clip(key)!r} on this host ({exc.strerror})", field="key"
        ) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        # A second name (a hard link) could give a caller's prefix to an object someone else made.
        raise PermissionDenied(
            f"key {clip(key)!r} is not a plain shared-memory object with one name",
            reason=SHM_KEY_NOT_ALLOWED,
            metadata={"key": key, "prefix": prefix},
        )
    return SharedObject(key, fd, info.st_size)
