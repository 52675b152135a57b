"""The handlers of the methods admission does not guard: an unguarded method (ListModels, GetModel, health)
only parses its bytes safely, so that no method answers malformed input with UNKNOWN; a refused call (a
screening policy's refusal) is answered without its bytes being read."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import descriptor_pool

from server.admission.handlers import Context, Handler, abort
from server.admission.reader import Refused, parsing_reader
from server.errors import SluiceError


def parsing_handler(handler: Handler, path: str) -> Handler:
    """An unguarded method whose bytes do not parse answers INVALID_ARGUMENT naming the field, as the
    guarded ones do, instead of grpc's UNKNOWN."""
    try:
        descriptor = descriptor_pool.Default().FindMethodByName(path.lstrip("/").replace("/", ".")).input_type
    except KeyError:
        descriptor = None
    read = parsing_reader(handler.request_deserializer, descriptor)

    if handler.unary_stream is not None and not inspect.iscoroutinefunction(handler.unary_stream):
        stream_behaviour: Any = handler.unary_stream

        async def parsed_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, Refused):
                await abort(context, request.error)
            async for message in stream_behaviour(request, context):
                yield message

        return grpc.unary_stream_rpc_method_handler(
            parsed_stream, request_deserializer=read, response_serializer=handler.response_serializer
        )
    # A unary answer, or a stream written through context.write (health's Watch): one coroutine either way.
    behaviour: Any = handler.unary_unary or handler.unary_stream

    async def parsed(request: Any, context: Context) -> Any:
        if isinstance(request, Refused):
            await abort(context, request.error)
        return await behaviour(request, context)

    make = (
        grpc.unary_unary_rpc_method_handler if handler.unary_unary else grpc.unary_stream_rpc_method_handler
    )
    return make(parsed, request_deserializer=read, response_serializer=handler.response_serializer)


def refusing_handler(handler: Handler, error: SluiceError) -> Handler:
    """A handler that answers `error` without reading the request: its bytes are never deserialized."""

    async def refuse(request: Any, context: Context) -> Any:
        await abort(context, error)

    make = (
        grpc.unary_unary_rpc_method_handler if handler.unary_unary else grpc.unary_stream_rpc_method_handler
    )
    return make(refuse, request_deserializer=None, response_serializer=handler.response_serializer)
