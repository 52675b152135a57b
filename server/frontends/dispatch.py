"""The engine's side of a remote call: the method handlers a grpc.aio server would hold, run behind the same
interceptor, with a context whose deadline, metadata, trailers and aborts travel as records
(docs/frontends.md). A remote call is one asyncio task, as a direct call is in grpc.aio, so cancelling it
(the front end's CANCEL) reaches it wherever it waits."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

import grpc

from server.frontends.wire import MESSAGE, REPLY, STATUS, put_body

log = logging.getLogger(__name__)

#: Streamed messages a front end may hold unacknowledged: past it the engine's write waits, as a blocked
#: gRPC write would (the watchdog and the scheduler's stall timeout see it).
STREAM_WINDOW = 2

Handler = Any  # grpc.RpcMethodHandler; generic in the stubs only
Send = Callable[[tuple[Any, ...]], None]
Intercept = Callable[[Callable[[Any], Awaitable[Handler]], Any], Awaitable[Handler]]


class CallDetails(NamedTuple):
    """What grpc.HandlerCallDetails carries: the method path and the client's metadata."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class MethodTable:
    """The servicers' handlers by method path, filled by the generated `add_*_to_server` functions."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def add_generic_rpc_handlers(self, generic: Sequence[Any]) -> None:
        pass  # every generated servicer also registers its methods by name, below

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Handler]) -> None:
        for method, handler in handlers.items():
            self.handlers[f"/{service}/{method}"] = handler

    async def lookup(self, details: CallDetails) -> Handler:
        return self.handlers.get(details.method)


class RemoteContext:
    """The subset of grpc.aio's ServicerContext that Sluice's handlers and grpc's health servicer use."""

    def __init__(self, call_id: int, details: CallDetails, deadline: float | None, send: Send) -> None:
        self.call_id = call_id
        self.details = details
        self.deadline = deadline
        self.send = send
        self.trailers: tuple[tuple[str, str | bytes], ...] = ()
        self.finished = False  # its REPLY or STATUS is sent: nothing follows it
        self.unacked = 0
        self.acked = asyncio.Event()
        self.serializer: Callable[[Any], bytes] | None = None

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.details.invocation_metadata

    def set_trailing_metadata(self, trailers: Sequence[tuple[str, str | bytes]]) -> None:
        self.trailers = tuple(trailers)

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[Any] = ()
    ) -> None:
        """Sends the status now, from whichever task aborts (the write watchdog aborts a call blocked in
        a write): the front end delivers it behind the messages it still holds."""
        if trailing_metadata:
            self.trailers = tuple(trailing_metadata)
        self.finish(code.value[0], details)
        raise grpc.aio.AbortError()

    def finish(self, code: int, details: str = "") -> None:
        if not self.finished:
            self.finished = True
            self.send((STATUS, self.call_id, code, details, self.trailers))

    def reply(self, body: bytes) -> None:
        if not self.finished:
            self.finished = True
            self.send((REPLY, self.call_id, put_body(body), self.trailers))

    async def write(self, message: Any) -> None:
        assert self.serializer is not None
        await self.send_message(self.serializer(message))

    async def send_message(self, body: bytes) -> None:
        if self.finished:
            return
        while self.unacked >= STREAM_WINDOW:
            self.acked.clear()
            await self.acked.wait()
        self.unacked += 1
        self.send((MESSAGE, self.call_id, put_body(body)))

    def ack(self) -> None:
        self.unacked -= 1
        self.acked.set()


async def run_call(intercept: Intercept, table: MethodTable, context: RemoteContext, body: bytes) -> None:
    """Runs one call to its end and sends its answer: REPLY (unary), or STATUS after its messages."""
    try:
        handler = await intercept(table.lookup, context.details)
        if handler is None:
            context.finish(grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            return
        read = handler.request_deserializer
        request = read(body) if read is not None else body
        serialize = handler.response_serializer or _identity
        context.serializer = serialize
        if handler.unary_unary is not None:
            response = await handler.unary_unary(request, context)
            context.reply(serialize(response))
            return
        produced = handler.unary_stream(request, context)
        if inspect.isasyncgen(produced):
            try:
                async for message in produced:
                    await context.send_message(serialize(message))
            finally:
                # A call cancelled while its message waits for the window leaves the generator suspended
                # at its yield: closing it runs its finally (the slot's release) now, not when it is
                # collected (the cancellation storm found slots held by callers long gone).
                await produced.aclose()
        else:  # a stream written through context.write (health's Watch)
            await produced
        context.finish(0)
    except grpc.aio.AbortError:
        pass  # abort sent the status
    except asyncio.CancelledError:
        raise  # the front end gave the call up (or a drain ended it): nobody waits for a status
    except Exception:
        log.exception("a remote call to %s failed", context.details.method)
        context.finish(grpc.StatusCode.UNKNOWN.value[0], "Unexpected error")


def _identity(data: Any) -> bytes:
    return bytes(data)
