"""The records between a front end and the engine (docs/frontends.md): length-prefixed `marshal` tuples
over one Unix socket, with bodies over INLINE_BYTES in a POSIX shared-memory segment the reader unlinks.

Both sides parse with `RecordReader`, an asyncio Protocol that calls back once per whole record.
"""

from __future__ import annotations

import asyncio
import marshal
import secrets
import struct
from collections.abc import Callable
from multiprocessing import shared_memory
from typing import Any

# Record kinds: front end -> engine.
CALL, ACK, CANCEL, LISTENING, ARENA = 2, 3, 4, 5, 6
# Engine -> front end.
REPLY, MESSAGE, STATUS, SHUTDOWN, FREED = 10, 11, 12, 13, 14

INLINE_BYTES = 64 * 1024
_LENGTH = struct.Struct("<I")
# A body in shared memory travels in place of its bytes as (segment name, size), or as (offset, size) in the
# sender's arena (server/frontends/arena.py).
Body = bytes | tuple[str, int] | tuple[int, int]


def frame(record: tuple[Any, ...]) -> bytes:
    payload = marshal.dumps(record)
    return _LENGTH.pack(len(payload)) + payload


def put_body(data: bytes) -> bytes | tuple[str, int]:
    """`data` itself when small; else a shared-memory segment holding it, named for the reader."""
    if len(data) <= INLINE_BYTES:
        return data
    segment = shared_memory.SharedMemory(name=f"sluice-{secrets.token_hex(8)}", create=True, size=len(data))
    try:
        memoryview(segment.buf)[: len(data)] = data  # type: ignore[arg-type]  # set: the segment is open
    finally:
        segment.close()
    untrack(segment)
    return (segment.name, len(data))


def take_body(body: bytes | tuple[str, int]) -> bytes:
    """The bytes of a body; a shared-memory one is read once and unlinked."""
    if isinstance(body, bytes):
        return body
    name, size = body
    segment = shared_memory.SharedMemory(name=name)
    try:
        return bytes(memoryview(segment.buf)[:size])  # type: ignore[arg-type]  # set: the segment is open
    finally:
        segment.close()
        segment.unlink()


def drop_body(body: bytes | tuple[str, int]) -> None:
    """Unlinks a body that will never be read (its call was cancelled first)."""
    if not isinstance(body, bytes):
        try:
            segment = shared_memory.SharedMemory(name=body[0])
        except FileNotFoundError:
            return
        segment.close()
        segment.unlink()


def untrack(segment: shared_memory.SharedMemory) -> None:
    # The resource tracker would unlink the segment when this process exits, or warn about it: its
    # reader owns it from now on.
    from multiprocessing import resource_tracker

    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]


class RecordReader(asyncio.Protocol):
    """Calls `on_record` for each whole record and `on_lost` once when the connection ends."""

    def __init__(
        self, on_record: Callable[[tuple[Any, ...]], None], on_lost: Callable[[Exception | None], None]
    ) -> None:
        self._on_record = on_record
        self._on_lost = on_lost
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start, end = 0, len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if end - start - 4 < length:
                break
            record = marshal.loads(buffer[start + 4 : start + 4 + length])
            start += 4 + length
            self._on_record(record)
        if start:
            del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost(exc)

    def send(self, record: tuple[Any, ...]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(record))
