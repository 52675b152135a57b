"""The upstream response streams of one HTTP request as a relay reads them: the next message of any of them,
or HEARTBEAT after a quiet interval, without timing out (and so cancelling) a gRPC read.

A reader task per call keeps at most one message of its call ahead of the relay, so a client that reads
slowly still holds the server back through gRPC flow control. Per message this costs one future; one
repeating timer finds the quiet intervals. A task and a timed asyncio.wait per message (the obvious way)
cost the shim several microseconds more per streamed token, on every token of every stream.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import grpc

T = TypeVar("T")
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # missing from grpc's stubs


class Heartbeat(enum.Enum):
    HEARTBEAT = "heartbeat"


HEARTBEAT = Heartbeat.HEARTBEAT


class PacedStream(Generic[T]):
    """`await next()`: `(index, item)`, item being a message of `calls[index]`, grpc.aio.EOF once that call
    ended, or its AioRpcError; or HEARTBEAT when nothing arrived from any call for between one and two
    `heartbeat_s`. Raises CancelledError once a call was cancelled from outside, or once every call has
    ended and all was taken. close() stops reading."""

    def __init__(self, calls: Sequence[grpc.aio.UnaryStreamCall[Any, T]], *, heartbeat_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._items: deque[tuple[int, T | grpc.aio.EOFType | grpc.aio.AioRpcError]] = deque()
        self._unread = [0] * len(calls)  # items of each call the relay has not taken yet
        self._taken: list[asyncio.Future[None] | None] = [None] * len(calls)
        self._waiter: asyncio.Future[None] | None = None
        self._heard = False  # something arrived since the timer last looked
        self._quiet = False  # the timer found a quiet interval: the next empty wait answers HEARTBEAT
        self._reading = len(calls)  # readers still running
        self._broken: BaseException | None = None  # why a reader stopped before its call's end
        self._interval = heartbeat_s
        self._timer = self._loop.call_later(heartbeat_s, self._tick)
        self._readers = [self._loop.create_task(self._read(i, call)) for i, call in enumerate(calls)]
        for reader in self._readers:
            reader.add_done_callback(self._on_reader_done)

    async def _read(self, index: int, call: grpc.aio.UnaryStreamCall[Any, T]) -> None:
        try:
            while True:
                item = await call.read()
                self._put(index, item)
                if item is _EOF:
                    break
                if self._unread[index]:  # the relay has not taken it yet: read no further
                    taken = self._taken[index] = self._loop.create_future()
                    await taken
        except grpc.aio.AioRpcError as exc:
            self._put(index, exc)
        self._reading -= 1

    def _on_reader_done(self, reader: asyncio.Task[None]) -> None:
        if reader.cancelled():  # the call was cancelled from outside
            self._broken = asyncio.CancelledError("the upstream stream was cancelled")
        elif (failure := reader.exception()) is not None:
            self._broken = failure  # raised by next(), to fail the relay with its traceback
        self._wake()

    def _put(self, index: int, item: T | grpc.aio.EOFType | grpc.aio.AioRpcError) -> None:
        self._items.append((index, item))
        self._unread[index] += 1
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

    async def next(self) -> tuple[int, T | grpc.aio.EOFType | grpc.aio.AioRpcError] | Heartbeat:
        while not self._items:
            if self._quiet:
                self._quiet = False
                return HEARTBEAT
            if self._broken is not None:
                raise self._broken
            if not self._reading:
                raise asyncio.CancelledError("the upstream stream was cancelled")
            self._waiter = self._loop.create_future()
            await self._waiter
        self._quiet = False
        index, item = self._items.popleft()
        self._unread[index] -= 1
        taken = self._taken[index]
        if taken is not None and not taken.done():
            taken.set_result(None)
        return index, item

    def close(self) -> None:
        self._timer.cancel()
        for reader in self._readers:
            reader.cancel()
