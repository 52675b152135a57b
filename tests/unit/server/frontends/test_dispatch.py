"""The engine's side of a remote call: answers, aborts from any task, the stream window, unknown methods."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from server.frontends.dispatch import STREAM_WINDOW, CallDetails, MethodTable, RemoteContext, run_call
from server.frontends.wire import MESSAGE, REPLY, STATUS


async def _through(continuation: Any, details: Any) -> Any:
    return await continuation(details)


def _table(**handlers: Any) -> MethodTable:
    table = MethodTable()
    table.add_registered_method_handlers("t.S", handlers)
    return table


def _context(method: str, sent: list[tuple[Any, ...]], deadline: float | None = None) -> RemoteContext:
    return RemoteContext(7, CallDetails(f"/t.S/{method}", (("k", "v"),)), deadline, sent.append)


def test_a_unary_answer_is_one_reply_with_its_trailers() -> None:
    async def echo(request: bytes, context: Any) -> bytes:
        context.set_trailing_metadata((("x-request-id", "r1"),))
        return request.upper()

    sent: list[tuple[Any, ...]] = []
    table = _table(Echo=grpc.unary_unary_rpc_method_handler(echo))
    asyncio.run(run_call(_through, table, _context("Echo", sent), b"abc"))
    assert sent == [(REPLY, 7, b"ABC", (("x-request-id", "r1"),))]


def test_an_abort_is_one_status_and_an_unknown_method_unimplemented() -> None:
    async def refuse(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", (("grpc-retry-pushback-ms", "5"),))
        raise AssertionError("abort returned")

    sent: list[tuple[Any, ...]] = []
    table = _table(Refuse=grpc.unary_unary_rpc_method_handler(refuse))
    asyncio.run(run_call(_through, table, _context("Refuse", sent), b""))
    asyncio.run(run_call(_through, table, _context("Nothing", sent), b""))
    code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert sent == [
        (STATUS, 7, code, "full", (("grpc-retry-pushback-ms", "5"),)),
        (STATUS, 7, grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!", ()),
    ]


def test_a_stream_waits_for_acks_past_its_window_and_ends_with_ok() -> None:
    async def count(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(5):
            yield bytes([i])

    async def scenario() -> list[tuple[Any, ...]]:
        sent: list[tuple[Any, ...]] = []
        context = _context("Count", sent)
        table = _table(Count=grpc.unary_stream_rpc_method_handler(count))
        call = asyncio.create_task(run_call(_through, table, context, b""))
        for _ in range(10):
            await asyncio.sleep(0)
        assert [r[2] for r in sent] == [bytes([i]) for i in range(STREAM_WINDOW)]  # held at the window
        while not call.done():
            context.ack()
            await asyncio.sleep(0)
        return sent

    sent = asyncio.run(scenario())
    assert [r[0] for r in sent] == [MESSAGE] * 5 + [STATUS]
    assert sent[-1] == (STATUS, 7, 0, "", ())


def test_a_status_sent_by_another_task_ends_the_stream_once() -> None:
    """The write watchdog aborts a stream blocked in a write from its own task, then cancels the call."""

    async def forever(request: bytes, context: Any) -> AsyncIterator[bytes]:
        while True:
            yield b"."

    async def scenario() -> list[tuple[Any, ...]]:
        sent: list[tuple[Any, ...]] = []
        context = _context("Forever", sent)
        table = _table(Forever=grpc.unary_stream_rpc_method_handler(forever))
        call = asyncio.create_task(run_call(_through, table, context, b""))
        for _ in range(10):
            await asyncio.sleep(0)
        with contextlib.suppress(grpc.aio.AbortError):
            await context.abort(grpc.StatusCode.CANCELLED, "stalled")
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        return sent

    sent = asyncio.run(scenario())
    assert [r[0] for r in sent] == [MESSAGE] * STREAM_WINDOW + [STATUS]
    assert sent[-1][2:4] == (grpc.StatusCode.CANCELLED.value[0], "stalled")


def test_the_deadline_is_the_front_ends_absolute_one() -> None:
    import time

    context = _context("X", [], deadline=time.monotonic() + 5)
    remaining = context.time_remaining()
    assert remaining is not None and 4 < remaining <= 5
    assert _context("X", [], deadline=time.monotonic() - 1).time_remaining() == 0.0
    assert _context("X", []).time_remaining() is None


def test_a_stream_cancelled_at_its_window_closes_its_generator_at_once() -> None:
    """Its finally (where a guarded stream releases its slot) runs as the call is cancelled."""
    released: list[bool] = []

    async def holding(request: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"."
        finally:
            released.append(True)

    async def scenario() -> None:
        context = _context("Holding", [])
        table = _table(Holding=grpc.unary_stream_rpc_method_handler(holding))
        call = asyncio.create_task(run_call(_through, table, context, b""))
        for _ in range(10):
            await asyncio.sleep(0)
        assert context.unacked == STREAM_WINDOW and not released  # blocked on the window
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert released == [True]

    asyncio.run(scenario())
