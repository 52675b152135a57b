"""A front-end process (docs/frontends.md): a grpc.aio server on the shared port that forwards every call's
bytes to the engine and its answer back. It holds TLS, the connection limits and reflection; no model, no
torch, no admission (the engine's one gate decides).

    python -m server.frontends.frontend ENGINE_SOCKET_NAME SETTINGS_JSON ENGINE_PID   (started by the engine)
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2
from sluice.inference.v1 import inference_pb2 as pb
from sluice.kserve.v2 import grpc_service_pb2 as v2

from process.limits import raise_fd_limit
from server.config import Settings
from server.frontends.arena import RequestArena
from server.frontends.wire import (
    ACK,
    ARENA,
    CALL,
    CANCEL,
    FREED,
    LISTENING,
    MESSAGE,
    REPLY,
    SHUTDOWN,
    RecordReader,
    drop_body,
    take_body,
)
from server.transport.options import BUSY_PORT, server_options
from server.transport.reflection import enable_reflection
from server.transport.tls import server_credentials

log = logging.getLogger("server.frontend")

_PR_SET_PDEATHSIG = 1
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_SERVICES = [
    pb.DESCRIPTOR.services_by_name["InferenceService"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    # KServe v2's unary methods; its ModelStreamInfer streams requests, which front ends do not forward.
    v2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
]


class _Call:
    __slots__ = ("answers", "finished", "id")

    def __init__(self, call_id: int) -> None:
        self.id = call_id
        self.answers: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.finished = False


class EngineLink:
    """The front end's one connection to the engine, and the calls in flight on it."""

    def __init__(self, arena: RequestArena) -> None:
        self.arena = arena
        self.calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self.closed = asyncio.Event()
        self.grace_s = 1.0  # what the engine's SHUTDOWN leaves of its grace period
        self.reader = RecordReader(self._on_record, lambda _: self.closed.set())

    def _on_record(self, record: tuple[Any, ...]) -> None:
        kind, call_id = record[0], record[1]
        if kind == FREED:
            self.arena.freed()
            return
        if kind == SHUTDOWN:
            self.grace_s = record[2]
            self.closed.set()
            return
        call = self.calls.get(call_id)
        if call is not None:
            call.answers.put_nowait(record)
        elif kind in (REPLY, MESSAGE):
            drop_body(record[2])  # the call left first: nobody reads this answer

    def start(self, method: str, body: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> _Call:
        call = _Call(next(self._ids))
        self.calls[call.id] = call
        metadata = tuple((m[0], m[1]) for m in context.invocation_metadata() or ())
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        self.reader.send((CALL, call.id, method, metadata, deadline, self.arena.put(body)))
        return call

    def end(self, call: _Call) -> None:
        """However the call ended: a call the engine still runs (the client left) is cancelled there."""
        self.calls.pop(call.id, None)
        if not call.finished:
            self.reader.send((CANCEL, call.id))


async def _finish(record: tuple[Any, ...], context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """Ends the call with a STATUS record's code, details and trailers."""
    _, _, code, details, trailers = record
    if code == 0:
        context.set_trailing_metadata(trailers)
        return
    await context.abort(_CODES.get(code, grpc.StatusCode.UNKNOWN), details, trailers)


if TYPE_CHECKING:
    _GenericRpcHandler = grpc.GenericRpcHandler[Any, Any]
else:  # the runtime class is not generic; only the type stubs are
    _GenericRpcHandler = grpc.GenericRpcHandler


class Forwarder(_GenericRpcHandler):
    """Every unary and server-streaming method of the engine's services, forwarded as bytes."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link
        self._handlers: dict[str, Any] = {}

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        path = details.method
        handler = self._handlers.get(path)
        if handler is None and path.startswith(tuple(f"/{s}/" for s in _SERVICES)):
            try:
                method = descriptor_pool.Default().FindMethodByName(path[1:].replace("/", "."))
            except KeyError:
                return None
            if method.client_streaming:
                return None
            handler = self._stream(path) if method.server_streaming else self._unary(path)
            self._handlers[path] = handler
        return handler

    def _unary(self, path: str) -> Any:
        link = self.link

        async def forward(body: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            call = link.start(path, body, context)
            try:
                record = await call.answers.get()
                call.finished = True
            finally:
                link.end(call)
            if record[0] == REPLY:
                context.set_trailing_metadata(record[3])
                return take_body(record[2])
            await _finish(record, context)
            return b""

        return grpc.unary_unary_rpc_method_handler(forward)

    def _stream(self, path: str) -> Any:
        link = self.link

        async def forward(body: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
            call = link.start(path, body, context)
            try:
                while True:
                    record = await call.answers.get()
                    if record[0] != MESSAGE:
                        call.finished = True
                        break
                    yield take_body(record[2])
                    link.reader.send((ACK, call.id))  # gRPC took it: the engine may send one more
            finally:
                link.end(call)
            await _finish(record, context)

        return grpc.unary_stream_rpc_method_handler(forward)


async def serve(address: str, settings: Settings) -> int:
    # Room for a few of the largest requests in transit at once; more take segments of their own.
    arena = RequestArena(4 * settings.max_message_bytes)
    try:
        return await _serve(address, settings, EngineLink(arena))
    finally:
        arena.close()


async def _serve(address: str, settings: Settings, link: EngineLink) -> int:
    loop = asyncio.get_running_loop()
    await loop.create_unix_connection(lambda: link.reader, "\0" + address)
    link.reader.send((ARENA, 0, link.arena.name))
    fds = raise_fd_limit()
    options = server_options(settings, fds.connection_cap(settings.max_connections), share_port=True)
    server = grpc.aio.server(options=options)
    if settings.reflection:
        enable_reflection(server, _SERVICES)
    server.add_generic_rpc_handlers((Forwarder(link),))
    bind = f"{settings.host}:{settings.port}"
    try:
        tls = settings.tls
        if tls is None:
            port = server.add_insecure_port(bind)
        else:
            port = server.add_secure_port(bind, server_credentials(tls))
    except RuntimeError:
        link.reader.send((LISTENING, 0, None, BUSY_PORT.format(address=bind)))
        await asyncio.sleep(0)
        return 2
    await server.start()
    link.reader.send((LISTENING, 0, port, ""))
    # A signal to the whole process group (Ctrl-C, systemd's control-group kill) reaches the front ends
    # too; they leave the drain to the engine, which stops them once its calls are done (SHUTDOWN). An
    # engine that dies closes the socket, which ends this process (and the kernel sends SIGTERM anyway).
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _leave_to_engine, link)
    await link.closed.wait()
    log.info("front end %d stopping: %.1f s for the calls it still carries", os.getpid(), link.grace_s)
    await server.stop(link.grace_s)
    return 0


def _leave_to_engine(link: EngineLink) -> None:
    if link.reader.transport is None or link.reader.transport.is_closing():
        link.closed.set()  # no engine to wait for
    else:
        log.info("front end %d: the engine drains; waiting for its word", os.getpid())


def _die_with(parent: int) -> None:
    """SIGTERM when the engine dies, however it dies (the kernel sends it)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the line above
        sys.exit(1)


def main() -> int:
    address, settings_json, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    _die_with(parent)
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(settings_json).items()
    }
    settings = Settings(**fields)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(address, settings))


if __name__ == "__main__":
    sys.exit(main())
