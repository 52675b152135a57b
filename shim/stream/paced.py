"""One upstream response stream as an SSE relay reads it: the next message, or HEARTBEAT after a quiet
interval, without timing out (and so cancelling) the gRPC read.

A reader task keeps at most one message ahead of the relay, so a client that reads slowly still holds the
server back through gRPC flow control. Per message this costs one future; one repeating timer per stream
finds the quiet intervals. A task and a timed asyncio.wait per message (the obvious way) cost the shim
several microseconds more per streamed token, on every token of every stream.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from typing import Any, Generic, TypeVar

import grpc

T = TypeVar("T")
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc's stubs


class Heartbeat(enum.Enum):
    HEARTBEAT = "heartbeat"


HEARTBEAT = Heartbeat.HEARTBEAT


class PacedStream(Generic[T]):
    """`await next()`: a message, grpc.aio.EOF once the stream ended, or HEARTBEAT when nothing arrived for
    between one and two `heartbeat_s`; raises the call's AioRpcError. close() stops reading."""

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, T], *, heartbeat_s: float) -> None:
        self._call = call
        self._loop = asyncio.get_running_loop()
        self._items: deque[T | grpc.aio.EOFType | grpc.aio.AioRpcError] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._taken: asyncio.Future[None] | None = None
        self._heard = False  # something arrived since the timer last looked
        self._quiet = False  # the timer found a quiet interval: the next empty wait answers HEARTBEAT
        self._interval = heartbeat_s
        self._timer = self._loop.call_later(heartbeat_s, self._tick)
        self._reader = self._loop.create_task(self._read())
        self._reader.add_done_callback(lambda _: self._wake())

    async def _read(self) -> None:
        try:
            while True:
                item = await self._call.read()
                self._put(item)
                if item is _EOF:
                    return
                if self._items:  # the relay has not taken it yet: read no further
                    self._taken = self._loop.create_future()
                    await self._taken
        except grpc.aio.AioRpcError as exc:
            self._put(exc)

    def _put(self, item: T | grpc.aio.EOFType | grpc.aio.AioRpcError) -> None:
        self._items.append(item)
        self._heard = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _tick(self) -> None:
        if not self._heard:
            self._quiet = True
            self._wake()
        self._heard = False
        self._timer = self._loop.call_later(self._interval, self._tick)

    async def next(self) -> T | grpc.aio.EOFType | Heartbeat:
        while not self._items:
            if self._quiet:
                self._quiet = False
                return HEARTBEAT
            if self._reader.done():  # cancelled from outside (the call was cancelled)
                raise asyncio.CancelledError("the upstream stream was cancelled")
            self._waiter = self._loop.create_future()
            await self._waiter
        self._quiet = False
        item = self._items.popleft()
        taken = self._taken
        if taken is not None and not taken.done():
            taken.set_result(None)
        if isinstance(item, grpc.aio.AioRpcError):
            raise item
        return item

    def close(self) -> None:
        self._timer.cancel()
        self._reader.cancel()
