"""Consuming one Generate call: collected into a single JSON answer, or relayed as SSE events with
heartbeats, pulling one gRPC message per event so back-pressure reaches the server through flow control."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import finish_reason_name
from shim.errors import ErrorBody, from_rpc_error, from_stream_error, upstream_protocol_error
from shim.native.translate import json_field_for, usage_to_json
from shim.stream import sse
from shim.stream.paced import HEARTBEAT, PacedStream

GenerateCall = grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]

_ENDED_EARLY = "the upstream ended the generation without a final message"


async def first_message(call: GenerateCall) -> pb.GenerateResponse:
    """The first message, so that errors before any token become plain HTTP errors, not a 200 stream.

    A failed call raises its AioRpcError, for the route's `upstream_errors` to map.
    """
    message = await call.read()
    if not isinstance(message, pb.GenerateResponse):
        raise upstream_protocol_error(_ENDED_EARLY)
    return message


def _stream_error(message: pb.GenerateResponse) -> ErrorBody | None:
    if not message.HasField("error"):
        return None
    return from_stream_error(message.error.code, message.error.message, message.error.reason)


async def collect(call: GenerateCall, first: pb.GenerateResponse) -> dict[str, Any]:
    """Reads the whole stream into the non-streaming JSON answer (a failed call raises its AioRpcError)."""
    texts: list[str] = []
    token_ids: list[int] = []
    message: pb.GenerateResponse | grpc.aio.EOFType = first
    while isinstance(message, pb.GenerateResponse):
        texts.append(message.text)
        token_ids.extend(message.token_ids)
        finish_reason = finish_reason_name(message.finish_reason)
        if finish_reason is not None:
            answer: dict[str, Any] = {
                "text": "".join(texts),
                "token_ids": token_ids,
                "finish_reason": finish_reason,
                "usage": usage_to_json(message.usage),
            }
            if (error := _stream_error(message)) is not None:
                answer["error"] = error.to_json()
            return answer
        message = await call.read()
    raise upstream_protocol_error(_ENDED_EARLY)


async def relay_events(
    call: GenerateCall, first: pb.GenerateResponse, *, heartbeat_s: float, reconnect_s: float
) -> AsyncIterator[bytes]:
    """SSE events for the stream: `token` per message with output, then exactly one `done` or `error`.

    Starlette cancels this generator when the client disconnects; the `finally` then cancels the call.
    """
    message: pb.GenerateResponse = first
    # Only the next message is read ahead of the events the client has taken.
    stream = PacedStream(call, heartbeat_s=heartbeat_s)
    try:
        while True:
            if message.text or message.token_ids:
                yield sse.token_event(message.text, list(message.token_ids))
            finish_reason = finish_reason_name(message.finish_reason)
            if finish_reason is not None:
                yield sse.done_event(finish_reason, usage_to_json(message.usage), _stream_error(message))
                return
            try:
                while (received := await stream.next()) is HEARTBEAT:
                    yield sse.PING
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc, json_field=json_field_for, reconnect_s=reconnect_s)
                yield sse.error_event(error.body)
                return
            if not isinstance(received, pb.GenerateResponse):
                yield sse.error_event(upstream_protocol_error(_ENDED_EARLY).body)
                return
            message = received
    finally:
        stream.close()
        call.cancel()
