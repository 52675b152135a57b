"""stream/paced.py: heartbeats that never cancel the pending read, at most one message of each call read
ahead of the relay, a call's error handed over as its item, and a call cancelled from outside."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from shim.stream.paced import HEARTBEAT, PacedStream

pytestmark = pytest.mark.anyio
CANCELLED = object()


class FakeCall:
    """A grpc.aio stream call fed by the test: read() returns what was put, raises an exception put, and
    raises CancelledError for CANCELLED (what grpc.aio does once the call is cancelled)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.reads = 0
        self.interrupted = False

    async def read(self) -> Any:
        self.reads += 1
        try:
            item = await self.queue.get()
        except asyncio.CancelledError:
            self.interrupted = True
            raise
        if item is CANCELLED:
            raise asyncio.CancelledError
        if isinstance(item, BaseException):
            raise item
        return item


def paced(*calls: FakeCall, heartbeat_s: float = 10.0) -> PacedStream[Any]:
    return PacedStream(list(calls), heartbeat_s=heartbeat_s)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_quiet_call_gets_heartbeats_and_its_read_is_never_cancelled() -> None:
    call = FakeCall()
    stream = paced(call, heartbeat_s=0.01)
    try:
        assert await stream.next() is HEARTBEAT
        assert await stream.next() is HEARTBEAT
        assert not call.interrupted and call.reads == 1
        call.queue.put_nowait("message")
        assert await stream.next() == (0, "message")
    finally:
        stream.close()


async def test_each_call_is_read_at_most_one_message_ahead() -> None:
    first, second = FakeCall(), FakeCall()
    for n in range(3):
        first.queue.put_nowait(f"a{n}")
        second.queue.put_nowait(f"b{n}")
    stream = paced(first, second)
    try:
        await settle()
        assert (first.reads, second.reads) == (1, 1)  # one message each waits for the relay
        taken = [await stream.next(), await stream.next()]
        assert sorted(taken) == [(0, "a0"), (1, "b0")]
        await settle()
        assert (first.reads, second.reads) == (2, 2)
        first.queue.put_nowait(grpc.aio.EOF)  # type: ignore[attr-defined]
        rest = [await stream.next() for _ in range(4)]
        assert [item for item in rest if item[0] == 0] == [(0, "a1"), (0, "a2")]
        assert [item for item in rest if item[0] == 1] == [(1, "b1"), (1, "b2")]
        assert await stream.next() == (0, grpc.aio.EOF)  # type: ignore[attr-defined]
    finally:
        stream.close()


async def test_a_failed_call_is_its_item_and_a_cancelled_one_ends_the_stream() -> None:
    failing, cancelled = FakeCall(), FakeCall()
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), details="boom"
    )
    failing.queue.put_nowait(error)
    stream = paced(failing, cancelled)
    try:
        assert await stream.next() == (0, error)
        cancelled.queue.put_nowait(CANCELLED)
        with pytest.raises(asyncio.CancelledError):
            await stream.next()
    finally:
        stream.close()
