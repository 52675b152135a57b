"""AdmissionInterceptor: refuses or admits Infer/Generate calls before the servicer sees them.

Every refusal (draining, warming up, unknown model or wrong RPC, memory breaker open, the model's queue
full) is decided by the deserializer from the model the raw request names (server/admission/reader.py): a
refused body is never parsed. Admitted calls wait in their model's gate by priority; the slot is released
once the unary call returns or the stream has ended, on every path, or by the WriteWatchdog when the peer
stops accepting data.
"""

from __future__ import annotations

import contextvars
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool
from prometheus_client import Counter, Gauge, Histogram

from server.admission.breaker import MemoryBreaker
from server.admission.gate import AdmissionGate
from server.admission.reader import GuardedMethod, Refused, admission_reader, parsing_reader
from server.admission.watchdog import WriteWatchdog
from server.codec.messages import decode_priority
from server.errors import InvalidArgument, ModelNotFound, NotReady, ShuttingDown, SluiceError, WrongMethod
from server.metrics import Metrics
from server.status import to_grpc_status

# The admitted call's wait for a slot, for the servicer's Timings (same task, so the context carries it).
ADMISSION_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar("admission_wait", default=0.0)


@dataclass(frozen=True, slots=True)
class _Instruments:
    waiting: Gauge
    admitted: Counter
    queued: Counter
    in_flight: Gauge
    queue_wait: Histogram


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: SluiceError) -> None:
    status = to_grpc_status(error)
    await context.abort(status.code, status.details, status.trailing_metadata)


if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # the runtime class is not generic; only the type stubs are
    _ServerInterceptor = grpc.aio.ServerInterceptor


class _Slot:
    """One admitted call's hold on its gate; released exactly once, whichever path gets there first."""

    __slots__ = ("admitted", "gate", "in_flight", "released")

    def __init__(self, gate: AdmissionGate, in_flight: Gauge) -> None:
        self.gate = gate
        self.in_flight = in_flight
        self.admitted = time.monotonic()
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.in_flight.dec()
            self.gate.release(time.monotonic() - self.admitted)


class AdmissionInterceptor(_ServerInterceptor):
    def __init__(
        self,
        methods: Mapping[str, GuardedMethod],
        *,
        breaker: MemoryBreaker | None,
        metrics: Metrics,
        max_message_bytes: int,
        stall_timeout_s: float,
    ) -> None:
        self.methods = dict(methods)
        self.breaker = breaker
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self.draining = False
        self.ready = False
        # Twice the stall timeout: a stalled consumer is first ended by its scheduler, with a final message
        # that is delivered if the peer reads again; the watchdog is the backstop for a stream that cannot
        # even take that message because its last write never completed.
        self.watchdog = WriteWatchdog(
            timeout_s=2 * stall_timeout_s, on_stall=lambda model: metrics.write_stalled.labels(model).inc()
        )
        self._children: dict[tuple[str, str], _Instruments] = {}
        self._guarded_handlers: dict[tuple[str, int, int], grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        path = handler_call_details.method
        method = self.methods.get(path)
        # Built once per method (and per install of the models): the wrapper holds no per-call state.
        key = (path, id(method), id(handler))
        wrapped = self._guarded_handlers.get(key)
        if wrapped is None:
            wrapped = self._guarded(handler, method) if method is not None else _parsing(handler, path)
            self._guarded_handlers[key] = wrapped
        return wrapped

    @property
    def gates(self) -> list[AdmissionGate]:
        return [gate for method in self.methods.values() for gate in method.gates.values()]

    def refusal(self, method: GuardedMethod, model: str) -> SluiceError | None:
        """Why a call to `model` through `method` may not even queue, or None: decided from the model name
        alone, before the request is parsed."""
        if self.draining:
            return ShuttingDown("the server is draining; retry on another replica", retry_after_s=1.0)
        if not self.ready:
            return NotReady("the server is loading and warming up its models", retry_after_s=1.0)
        if not model:
            return InvalidArgument("model must be set", field="model")
        gate = method.gates.get(model)
        if gate is None:
            serving = method.elsewhere.get(model)
            if serving is not None:
                return WrongMethod(model, method.name, serving)
            return ModelNotFound(model, sorted(method.gates))
        if self.breaker is not None and self.breaker.is_open:
            return self.breaker.refusal()
        if gate.is_full():
            return gate.overloaded()
        return None

    def _guarded(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: GuardedMethod
    ) -> grpc.RpcMethodHandler[Any, Any]:
        read = admission_reader(
            method,
            handler.request_deserializer,
            decide=self.refusal,
            max_message_bytes=self.max_message_bytes,
        )
        watchdog = self.watchdog
        if handler.unary_stream is not None:
            stream_behaviour: Any = handler.unary_stream

            async def guarded_stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                slot = await self._admit(request, context, method)
                watched = watchdog.watch(context, request.model, slot.release)
                clock = time.monotonic
                try:
                    async for message in stream_behaviour(request, context):
                        watched.writing_since = clock()
                        yield message
                        watched.writing_since = 0.0
                finally:
                    watchdog.forget(watched)
                    slot.release()

            return grpc.unary_stream_rpc_method_handler(
                guarded_stream, request_deserializer=read, response_serializer=handler.response_serializer
            )
        unary_behaviour: Any = handler.unary_unary

        async def guarded_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            slot = await self._admit(request, context, method)
            try:
                return await unary_behaviour(request, context)
            finally:
                slot.release()

        return grpc.unary_unary_rpc_method_handler(
            guarded_unary, request_deserializer=read, response_serializer=handler.response_serializer
        )

    async def _admit(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], method: GuardedMethod
    ) -> _Slot:
        """Waits for a slot; on refusal aborts the call (which raises) without holding anything."""
        if isinstance(request, Refused):
            self.metrics.refused.labels(request.model, method.name, request.error.reason).inc()
            await abort(context, request.error)
            raise request.error  # abort raises; this keeps type checkers aware that nothing is held
        model = request.model
        gate = method.gates.get(model)
        try:
            if gate is None:  # the reader checked; a message whose model changed under parsing lands here
                raise ModelNotFound(model, sorted(method.gates))
            instruments = self._instruments(model, method.name)
            queued = gate.in_use >= gate.slots
            instruments.waiting.inc()
            try:
                waited = await gate.acquire(decode_priority(request.priority), context.time_remaining())
            finally:
                instruments.waiting.dec()
        except SluiceError as error:
            self.metrics.refused.labels(model if gate is not None else "", method.name, error.reason).inc()
            await abort(context, error)
            raise
        instruments.admitted.inc()
        if queued:
            instruments.queued.inc()
        instruments.in_flight.inc()
        instruments.queue_wait.observe(waited)
        ADMISSION_WAIT.set(waited)
        return _Slot(gate, instruments.in_flight)

    def _instruments(self, model: str, method: str) -> _Instruments:
        """Labelled metric children, resolved once per served (model, method) rather than per request."""
        key = (model, method)
        found = self._children.get(key)
        if found is None:
            m = self.metrics
            found = _Instruments(
                m.waiting.labels(model, method),
                m.admitted.labels(model, method),
                m.queued.labels(model, method),
                m.in_flight.labels(model, method),
                m.queue_wait.labels(model, method),
            )
            self._children[key] = found
        return found


def _parsing(handler: grpc.RpcMethodHandler[Any, Any], path: str) -> grpc.RpcMethodHandler[Any, Any]:
    """An unguarded method (ListModels, GetModel, health) whose bytes do not parse answers INVALID_ARGUMENT
    naming the field, as the guarded ones do, instead of grpc's UNKNOWN."""
    try:
        descriptor = descriptor_pool.Default().FindMethodByName(path.lstrip("/").replace("/", ".")).input_type
    except KeyError:
        descriptor = None
    read = parsing_reader(handler.request_deserializer, descriptor)

    if handler.unary_stream is not None and not inspect.iscoroutinefunction(handler.unary_stream):
        stream_behaviour: Any = handler.unary_stream

        async def parsed_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if isinstance(request, Refused):
                await abort(context, request.error)
            async for message in stream_behaviour(request, context):
                yield message

        return grpc.unary_stream_rpc_method_handler(
            parsed_stream, request_deserializer=read, response_serializer=handler.response_serializer
        )
    # A unary answer, or a stream written through context.write (health's Watch): one coroutine either way.
    behaviour: Any = handler.unary_unary or handler.unary_stream

    async def parsed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Refused):
            await abort(context, request.error)
        return await behaviour(request, context)

    make = (
        grpc.unary_unary_rpc_method_handler if handler.unary_unary else grpc.unary_stream_rpc_method_handler
    )
    return make(parsed, request_deserializer=read, response_serializer=handler.response_serializer)
