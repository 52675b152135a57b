"""AdmissionInterceptor: refuses or admits Infer/Generate calls before the servicer sees them, by running
its list of admission policies (server/admission/policy.py, one file each in policies/).

Policies screen the metadata before the body is read (authentication), then the model the raw request
names before it is parsed (server/admission/reader.py: draining, readiness, the model, a tenant's models,
the memory breaker, the queue bound, the byte budget), then hold what they take around the slot (a
tenant's share and rate). Admitted calls wait in their model's gate by priority; the slot is released once
the unary call returns, the stream's KV slot is free or the stream has ended, on every path, or by the
WriteWatchdog when the peer stops accepting data (server/admission/handlers.py wraps each method).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import Counter, Gauge, Histogram

from process.access_log import AccessLog
from process.tracing import Tracing
from server.admission.devices import DeviceGates
from server.admission.gate import AdmissionGate
from server.admission.handlers import (
    ADMISSION_WAIT,
    Context,
    Handler,
    Slot,
    abort,
    guarded_handler,
)
from server.admission.policies import PolicySettings, default_policies
from server.admission.policy import Admission, AdmissionPolicy, Policies
from server.admission.policy_context import PolicyContext, Serving
from server.admission.reader import GuardedMethod, Refused, admission_reader
from server.admission.streams import guarded_bidi, refusing_bidi
from server.admission.tenants import Keys
from server.admission.unguarded import parsing_handler, refusing_handler
from server.admission.watchdog import WriteWatchdog
from server.codec.messages import decode_priority
from server.errors import ModelNotFound, SluiceError
from server.memory.breaker import MemoryBreaker
from server.metric_children import Observer, adder
from server.metrics import Metrics


def _metadata(details: grpc.HandlerCallDetails) -> dict[str, str]:
    return {
        key: value if isinstance(value, str) else value.decode("latin-1")
        for key, value in details.invocation_metadata or ()
    }


class RequestIds:
    """Ids for calls that name none: 16 hex digits, a random prefix per process and a counter, unique
    without a getrandom() call per request (secrets.token_hex was 2.4% of the event loop at 5,600 calls/s)."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(4)
        self._counter = itertools.count(secrets.randbits(32))

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFFFFFF:08x}"


@dataclass(frozen=True, slots=True)
class _Instruments:
    waiting: Gauge
    admitted: Counter
    queued: Counter
    in_flight: Gauge
    queue_wait: Histogram
    # The same children's hot-path updates (server/metric_children.py): one Python call or three, not five.
    add_admitted: Callable[[float], None]
    add_in_flight: Callable[[float], None]
    queue_wait_observer: Observer


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
        stall_timeout_s: float,
        access_log: AccessLog | None = None,
        keys: Keys | None = None,
        settings: PolicySettings | None = None,
        policies: Sequence[AdmissionPolicy] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """`policies`: the list to run, in order; by default the registered ones (policies/__init__.py),
        each built from the settings it declares (`settings`: the server's Settings; None: the defaults) and
        the server's objects (`keys`, `breaker`, `metrics`)."""
        self.methods = dict(methods)
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self.serving = Serving()
        context = PolicyContext(serving=self.serving, metrics=metrics, keys=keys, breaker=breaker)
        self.policies = Policies(
            policies if policies is not None else default_policies(settings or PolicySettings(), context)
        )
        self.access_log = access_log or AccessLog(0.0)
        self.tracing = tracing
        # Twice the stall timeout: a stalled consumer is first ended by its scheduler, with a final message
        # that is delivered if the peer reads again; the watchdog is the backstop for a stream that cannot
        # even take that message because its last write never completed.
        self.watchdog = WriteWatchdog(
            timeout_s=2 * stall_timeout_s, on_stall=lambda model: metrics.write_stalled.labels(model).inc()
        )
        self._children: dict[tuple[str, str], _Instruments] = {}
        self._request_ids = RequestIds()
        self._guarded_handlers: dict[tuple[str, int, int], grpc.RpcMethodHandler[Any, Any]] = {}

    @property
    def ready(self) -> bool:
        return self.serving.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self.serving.ready = value

    @property
    def draining(self) -> bool:
        return self.serving.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.serving.draining = value

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        path = handler_call_details.method
        method = self.methods.get(path)
        # A client stream is guarded only where each of its messages is a call (v2 ModelStreamInfer).
        if handler.request_streaming and (method is None or not handler.response_streaming):
            return handler
        if self.policies.screens:
            # Checked on the metadata alone, before the body is read: a refused call is never parsed.
            error = self.policies.screen(path, _metadata(handler_call_details))
            if error is not None:
                return (
                    refusing_bidi(handler, error)
                    if handler.request_streaming
                    else refusing_handler(handler, error)
                )
        # Built once per method (and per install of the models): the wrapper holds no per-call state.
        key = (path, id(method), id(handler))
        wrapped = self._guarded_handlers.get(key)
        if wrapped is None:
            wrapped = self._guarded(handler, method) if method is not None else parsing_handler(handler, path)
            self._guarded_handlers[key] = wrapped
        return wrapped

    @property
    def gates(self) -> list[AdmissionGate | DeviceGates]:
        return [gate for method in self.methods.values() for gate in method.gates.values()]

    def refusal(self, method: GuardedMethod, model: str) -> SluiceError | None:
        """Why a call to `model` through `method` may not even queue, or None: decided from the model name
        alone, before the request is parsed."""
        return self.policies.check(method, model)

    def _guarded(self, handler: Handler, method: GuardedMethod) -> Handler:
        read = admission_reader(
            method,
            handler.request_deserializer,
            decide=self.policies.check,
            max_message_bytes=self.max_message_bytes,
            weigh=self.policies.weigh,
        )
        if handler.stream_stream is not None:
            return guarded_bidi(
                handler, method, read=read, acquire=self._acquire, finish=self.policies.finish
            )
        return guarded_handler(
            handler,
            method,
            read=read,
            admit=self._admit,
            watchdog=self.watchdog,
            access_log=self.access_log,
            finish=self.policies.finish,
            tracing=self.tracing,
        )

    async def _admit(self, request: Any, context: Context, method: GuardedMethod) -> Slot:
        """Waits for a slot; on refusal aborts the call (which raises) without holding anything."""
        try:
            return await self._acquire(request, context, method)
        except SluiceError as error:
            await abort(context, error)
            raise

    async def _acquire(self, request: Any, context: Context, method: GuardedMethod) -> Slot:
        """Waits for a slot, or raises the refusal holding nothing. A call that names no request id gets
        one, for its logs and its answer."""
        if isinstance(request, Refused):
            self.metrics.refused.labels(request.model, method.name, request.error.reason).inc()
            raise request.error
        if not request.request_id:
            request.request_id = self._request_ids.next()
        model = request.model
        gate = method.gates.get(model)
        admission: Admission | None = None
        releases: list[Callable[[], None]] = []
        try:
            if gate is None:  # the reader checked; a message whose model changed under parsing lands here
                raise ModelNotFound(model, sorted(method.gates))
            admission = Admission(request, method, model, gate, decode_priority(request.priority))
            releases = self.policies.hold(admission)  # before it queues
            instruments = self._children.get((model, method.name)) or self._instruments(model, method.name)
            queued = gate.in_use >= gate.slots
            work = method.work_of(request) if method.work_of is not None else 0
            if queued or type(gate) is not AdmissionGate:  # it may wait: it counts as waiting meanwhile
                instruments.waiting.inc()
                try:
                    waited = await gate.acquire(admission.priority, context.time_remaining(), work)
                finally:
                    instruments.waiting.dec()
            else:  # a free slot is taken (or the call refused) without suspending: no one saw it wait
                waited = await gate.acquire(admission.priority, context.time_remaining(), work)
        except SluiceError as error:
            for release in reversed(releases):
                release()
            if admission is not None:
                self.policies.settle(admission, error)
            self.metrics.refused.labels(model if gate is not None else "", method.name, error.reason).inc()
            raise
        instruments.add_admitted(1)
        if queued:
            instruments.queued.inc()
        instruments.add_in_flight(1)
        instruments.queue_wait_observer.observe(waited)
        ADMISSION_WAIT.set(waited)
        self.policies.settle(admission, None)
        # With several devices the gate to release is the one this call was admitted on.
        return Slot(gate.held_gate(), instruments.add_in_flight, releases)

    def _instruments(self, model: str, method: str) -> _Instruments:
        """Labelled metric children, resolved once per served (model, method) rather than per request."""
        key = (model, method)
        found = self._children.get(key)
        if found is None:
            m = self.metrics
            admitted, in_flight = m.admitted.labels(model, method), m.in_flight.labels(model, method)
            queue_wait = m.queue_wait.labels(model, method)
            found = _Instruments(
                m.waiting.labels(model, method),
                admitted,
                m.queued.labels(model, method),
                in_flight,
                queue_wait,
                adder(admitted),
                adder(in_flight),
                Observer(queue_wait),
            )
            self._children[key] = found
        return found
