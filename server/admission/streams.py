"""The guarded handler of a bidirectional stream whose every message is a call of its own (the v2
ModelStreamInfer): each message is read by the admission reader and admitted into its model's gate on its
own, in the order it arrives; a refusal answers that message and the stream goes on. Each slot is given
back when its generation leaves (the servicer hands it to the scheduler), and every slot still held when
the stream ends, however it ends (a cancelled stream included), is given back then."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from server.admission.handlers import Context, Handler, Slot, abort
from server.admission.reader import GuardedMethod
from server.errors import SluiceError

Acquire = Callable[[Any, Context, GuardedMethod], Awaitable[Slot]]


@dataclass(frozen=True, slots=True)
class Admitted:
    """One message of the stream, admitted: the request and the slot it holds."""

    request: Any
    slot: Slot


@dataclass(frozen=True, slots=True)
class StreamRefusal:
    """One message of the stream that admission refused (or that did not parse)."""

    error: SluiceError


def guarded_bidi(
    handler: Handler,
    method: GuardedMethod,
    *,
    read: Callable[[bytes], Any],
    acquire: Acquire,
    finish: Callable[[], None],
) -> Handler:
    """The servicer's behaviour receives Admitted and StreamRefusal items instead of requests. `finish`
    runs after each message is admitted or refused: what a policy took for its bytes is given back once
    they are parsed (a stream may send many)."""
    behaviour: Any = handler.stream_stream

    async def guarded(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        held: list[Slot] = []

        async def admitted() -> AsyncIterator[Admitted | StreamRefusal]:
            async for request in requests:
                try:
                    slot = await acquire(request, context, method)
                except SluiceError as error:
                    yield StreamRefusal(error)
                    continue
                finally:
                    finish()
                held[:] = [s for s in held if not s.released]
                held.append(slot)
                yield Admitted(request, slot)

        try:
            async for message in behaviour(admitted(), context):
                yield message
        finally:
            for slot in held:
                slot.release()
            finish()

    return grpc.stream_stream_rpc_method_handler(
        guarded, request_deserializer=read, response_serializer=handler.response_serializer
    )


def refusing_bidi(handler: Handler, error: SluiceError) -> Handler:
    """A bidirectional stream refused on its metadata: answered with `error`, no message read."""

    async def refuse(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        await abort(context, error)
        yield  # pragma: no cover - abort raises; the yield makes this an async generator

    return grpc.stream_stream_rpc_method_handler(
        refuse, request_deserializer=None, response_serializer=handler.response_serializer
    )
