"""AdmissionInterceptor: refuses or admits Infer/Generate calls before the servicer sees them.

Refusals that need no request body (draining, memory breaker open, queue full) are decided in
intercept_service and answered by a handler with no deserializer: a refused body is never parsed.
Admitted calls wait in the gate by priority; the slot is released in `finally` once the unary call
returns or the stream has ended, on every path.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Gauge, Histogram

from server.admission.breaker import MemoryBreaker
from server.admission.gate import AdmissionGate
from server.codec.messages import decode_priority
from server.codec.wire import find_invalid_utf8
from server.errors import (
    InvalidArgument,
    ModelNotFound,
    NotReady,
    RequestTooLarge,
    ShuttingDown,
    SluiceError,
)
from server.metrics import Metrics
from server.status import to_grpc_status


@dataclass(frozen=True, slots=True)
class GuardedMethod:
    """One admission-controlled RPC: its gate, its request type and the models that serve it."""

    name: str
    gate: AdmissionGate
    request: Descriptor
    models: frozenset[str]


# The admitted call's wait for a slot, for the servicer's Timings (same task, so the context carries it).
ADMISSION_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar("admission_wait", default=0.0)


@dataclass(frozen=True, slots=True)
class _Instruments:
    waiting: Gauge
    admitted: Counter
    in_flight: Gauge
    queue_wait: Histogram


class _Malformed:
    def __init__(self, error: SluiceError) -> None:
        self.error = error


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: SluiceError) -> None:
    status = to_grpc_status(error)
    await context.abort(status.code, status.details, status.trailing_metadata)


if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # the runtime class is not generic; only the type stubs are
    _ServerInterceptor = grpc.aio.ServerInterceptor


class AdmissionInterceptor(_ServerInterceptor):
    def __init__(
        self,
        methods: Mapping[str, GuardedMethod],
        *,
        breaker: MemoryBreaker | None,
        metrics: Metrics,
        max_message_bytes: int,
    ) -> None:
        self.methods = dict(methods)
        self.breaker = breaker
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self.draining = False
        self._children: dict[tuple[str, str], _Instruments] = {}
        self._guarded_handlers: dict[tuple[str, int, int], grpc.RpcMethodHandler[Any, Any]] = {}
        self.ready = False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method = self.methods.get(handler_call_details.method)
        if method is None or handler is None:
            return handler
        refusal: SluiceError | None = None
        if self.draining:
            refusal = ShuttingDown("the server is draining; retry on another replica", retry_after_s=1.0)
        elif not self.ready:
            refusal = NotReady("the server is loading and warming up its models", retry_after_s=1.0)
        elif self.breaker is not None and self.breaker.is_open:
            refusal = self.breaker.refusal()
        elif method.gate.is_full():
            refusal = method.gate.overloaded()
        if refusal is not None:
            self.metrics.refused.labels("", method.name, refusal.reason).inc()
            return _refusing_handler(handler, refusal)
        # Built once per method (and per install of the models): the wrapper holds no per-call state.
        key = (handler_call_details.method, id(method), id(handler))
        guarded = self._guarded_handlers.get(key)
        if guarded is None:
            guarded = self._guarded_handlers[key] = self._guarded(handler, method)
        return guarded

    def _guarded(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: GuardedMethod
    ) -> grpc.RpcMethodHandler[Any, Any]:
        deserialize = self._safe_deserializer(handler.request_deserializer, method.request)
        if handler.unary_stream is not None:
            stream_behaviour: Any = handler.unary_stream

            async def guarded_stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                admitted = await self._admit(request, context, method)
                try:
                    async for message in stream_behaviour(request, context):
                        yield message
                finally:
                    self._release(method, request.model, admitted)

            return grpc.unary_stream_rpc_method_handler(
                guarded_stream,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        unary_behaviour: Any = handler.unary_unary

        async def guarded_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            admitted = await self._admit(request, context, method)
            try:
                return await unary_behaviour(request, context)
            finally:
                self._release(method, request.model, admitted)

        return grpc.unary_unary_rpc_method_handler(
            guarded_unary, request_deserializer=deserialize, response_serializer=handler.response_serializer
        )

    async def _admit(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], method: GuardedMethod
    ) -> float:
        """Waits for a slot; on refusal aborts the call (which raises) without holding anything."""
        model = getattr(request, "model", "")
        try:
            if isinstance(request, _Malformed):
                raise request.error
            if model not in method.models:
                raise ModelNotFound(model, sorted(method.models))
            instruments = self._instruments(model, method.name)
            instruments.waiting.inc()
            try:
                waited = await method.gate.acquire(
                    decode_priority(request.priority), context.time_remaining()
                )
            finally:
                instruments.waiting.dec()
        except SluiceError as error:
            self.metrics.refused.labels(model, method.name, error.reason).inc()
            await abort(context, error)
            raise  # abort raises; this keeps type checkers aware that nothing is held
        instruments.admitted.inc()
        instruments.in_flight.inc()
        instruments.queue_wait.observe(waited)
        ADMISSION_WAIT.set(waited)
        return time.monotonic()

    def _release(self, method: GuardedMethod, model: str, admitted: float) -> None:
        self._instruments(model, method.name).in_flight.dec()
        method.gate.release(time.monotonic() - admitted)

    def _instruments(self, model: str, method: str) -> _Instruments:
        """Labelled metric children, resolved once per (model, method) rather than per request."""
        key = (model, method)
        found = self._children.get(key)
        if found is None:
            m = self.metrics
            found = _Instruments(
                m.waiting.labels(model, method),
                m.admitted.labels(model, method),
                m.in_flight.labels(model, method),
                m.queue_wait.labels(model, method),
            )
            self._children[key] = found
        return found

    def _safe_deserializer(
        self, deserialize: Callable[[bytes], Any] | None, descriptor: Descriptor
    ) -> Callable[[bytes], Any]:
        """Turns parse failures into values the behaviour answers with INVALID_ARGUMENT naming the field."""
        limit = self.max_message_bytes

        def parse(data: bytes) -> Any:
            if len(data) > limit:
                return _Malformed(
                    RequestTooLarge(
                        f"the request is {len(data)} bytes; the limit is {limit}",
                        metadata={"size": len(data), "limit": limit},
                    )
                )
            try:
                return deserialize(data) if deserialize else data
            except DecodeError as exc:
                field = find_invalid_utf8(descriptor, data)
                if field is not None:
                    return _Malformed(InvalidArgument(f"{field} is not valid UTF-8", field=field))
                return _Malformed(InvalidArgument(f"the request could not be parsed: {exc}", field="request"))

        return parse


def _refusing_handler(
    handler: grpc.RpcMethodHandler[Any, Any], error: SluiceError
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape that aborts at once and never deserializes the body."""
    if handler.unary_stream is not None:

        async def refuse_stream(
            _request: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            await abort(context, error)
            yield None  # pragma: no cover - abort raises

        return grpc.unary_stream_rpc_method_handler(refuse_stream)

    async def refuse(_request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await abort(context, error)

    return grpc.unary_unary_rpc_method_handler(refuse)
