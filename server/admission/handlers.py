"""The handlers the interceptor puts in front of each method. A guarded one (Infer, Generate) admits the call
into its model's gate, holds the slot until the call returns or its stream ends (or the write watchdog ends
it), and writes the call's access-log line. The unguarded methods' handlers are in unguarded.py."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeAlias

import grpc

from process.access_log import AccessLog
from process.tracing import Tracing
from server.admission.gate import AdmissionGate
from server.admission.reader import GuardedMethod, Refused
from server.admission.tenants import CALLER, TENANT_KEY
from server.admission.watchdog import WriteWatchdog
from server.codec.status import to_grpc_status
from server.errors import SluiceError, clip
from server.tracing import CallTracer
from wire import metadata as metadata_names

Context = grpc.aio.ServicerContext[Any, Any]
REQUEST_ID_KEY = metadata_names.REQUEST_ID
# The end user a gateway acts for (the shim forwards OpenAI's `user`), recorded in the access log only.
USER_KEY = metadata_names.USER
USER_LOG_LIMIT = 64
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # grpc's class is generic in its stubs only

# The admitted call's wait for a slot, for the servicer's Timings (same task, so the context carries it).
ADMISSION_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar("admission_wait", default=0.0)
# The admitted stream's slot, for the servicer: the scheduler gives it back as it frees the KV slot, not
# when the last message has been written (a peer that stopped reading would hold it one stall longer).
STREAM_SLOT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("stream_slot", default=None)
# The error a call was aborted with, for its access-log line (set by abort, in the call's own task).
CALL_ERROR: contextvars.ContextVar[SluiceError | None] = contextvars.ContextVar("call_error", default=None)


async def abort(context: Context, error: SluiceError) -> None:
    CALL_ERROR.set(error)
    status = to_grpc_status(error)
    await context.abort(status.code, status.details, status.trailing_metadata)


class Slot:
    """One admitted call's hold on its gate; released exactly once, whichever path gets there first."""

    __slots__ = ("admitted", "gate", "in_flight", "on_release", "released")

    def __init__(
        self,
        gate: AdmissionGate,
        in_flight: Callable[[float], None],  # adds to the in-flight gauge (server/metric_children.py)
        on_release: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.gate = gate
        self.in_flight = in_flight
        self.on_release = on_release  # what policies took with the slot (a tenant's share), given back
        self.admitted = time.monotonic()
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.in_flight(-1)
            self.gate.release(time.monotonic() - self.admitted)
            for release in self.on_release:
                release()


Admit = Callable[[Any, Context, GuardedMethod], Awaitable[Slot]]


def _outcome(exc: BaseException | None) -> tuple[str, str]:
    """(status, reason) of a call that raised `exc` (None: it returned)."""
    if exc is None:
        return "OK", ""
    error = CALL_ERROR.get()
    if error is not None:
        return error.code, error.reason
    # Cancelled by the caller, or closed with its stream: no status of ours was sent.
    return ("CANCELLED", "") if isinstance(exc, asyncio.CancelledError | GeneratorExit) else ("UNKNOWN", "")


def guarded_handler(
    handler: Handler,
    method: GuardedMethod,
    *,
    read: Callable[[bytes], Any],
    admit: Admit,
    watchdog: WriteWatchdog,
    access_log: AccessLog,
    finish: Callable[[], None] = lambda: None,
    tracing: Tracing | None = None,
) -> Handler:
    """`finish` runs as the call ends, however it ends (the policies' finish hooks); with `tracing` on,
    each call has its spans (server/tracing.py)."""
    name = method.name
    tracer = CallTracer(tracing, _outcome) if tracing is not None and tracing.enabled else None
    if handler.unary_stream is not None:
        stream_behaviour: Any = handler.unary_stream

        async def guarded_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            call_log = _CallLog.sampled(access_log, name, request, context)
            traced = tracer.call(name, request, context) if tracer is not None else None
            with call_log or _UNLOGGED, traced or _UNLOGGED, _finally(finish):
                slot = await admit(request, context, method)
                if traced is not None:
                    traced.admit(ADMISSION_WAIT.get())
                STREAM_SLOT.set(slot)
                # A stream's answers carry no request id of their own: the trailers say which it was.
                context.set_trailing_metadata(_identity(request))
                watched = watchdog.watch(context, request.model, slot.release)
                clock = time.monotonic
                try:
                    async for message in stream_behaviour(request, context):
                        watched.writing_since = clock()
                        if call_log is not None:
                            call_log.answer = message
                        if traced is not None:
                            traced.answer = message
                        yield message
                        watched.writing_since = 0.0
                finally:
                    watchdog.forget(watched)
                    slot.release()

        return grpc.unary_stream_rpc_method_handler(
            guarded_stream, request_deserializer=read, response_serializer=handler.response_serializer
        )
    unary_behaviour: Any = handler.unary_unary

    async def guarded_unary(request: Any, context: Context) -> Any:
        call_log = _CallLog.sampled(access_log, name, request, context) if access_log.rate > 0 else None
        traced = tracer.call(name, request, context) if tracer is not None else None
        if call_log is None and traced is None:  # the common call: no context managers to enter and leave
            try:
                slot = await admit(request, context, method)
                context.set_trailing_metadata(_identity(request))
                try:
                    return await unary_behaviour(request, context)
                finally:
                    slot.release()
            finally:
                finish()
        with call_log or _UNLOGGED, traced or _UNLOGGED:
            try:  # not a generator context manager: building one per call showed in the event loop
                slot = await admit(request, context, method)
                if traced is not None:
                    traced.admit(ADMISSION_WAIT.get())
                context.set_trailing_metadata(_identity(request))
                try:
                    response = await unary_behaviour(request, context)
                finally:
                    slot.release()
                if call_log is not None:
                    call_log.answer = response
                if traced is not None:
                    traced.answer = response
                return response
            finally:
                finish()

    return grpc.unary_unary_rpc_method_handler(
        guarded_unary, request_deserializer=read, response_serializer=handler.response_serializer
    )


_UNLOGGED = contextlib.nullcontext()


@contextlib.contextmanager
def _finally(release: Callable[[], None]) -> Iterator[None]:
    """Runs `release` however the call ends (answered, refused, cancelled)."""
    try:
        yield
    finally:
        release()


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def _identity(request: Any) -> tuple[tuple[str, str], ...]:
    """The trailers that say which call this was, and on whose behalf. A caller's request id that is not
    printable ASCII (all gRPC metadata may carry) is percent-encoded: a raw one would fail the call."""
    request_id = request.request_id
    if not (len(request_id) <= 256 and request_id.isascii() and request_id.isprintable()):
        request_id = clip(request_id, 256)  # clipped first: the clip marker itself is not ASCII
        if not (request_id.isascii() and request_id.isprintable()):  # printable ASCII: " " to "~"
            request_id = urllib.parse.quote(request_id, safe="")
    pairs = ((REQUEST_ID_KEY, request_id),)
    tenant = CALLER.get()
    return pairs if tenant is None else (*pairs, (TENANT_KEY, urllib.parse.quote(tenant.name, safe=" ")))


class _CallLog:
    """The access-log line of one sampled call: opened as it arrives, written as it ends, however it ends.
    `answer` is the unary response, or a stream's last message."""

    __slots__ = ("answer", "log", "method", "request", "started", "user")

    def __init__(self, log: AccessLog, method: str, request: Any, context: Context) -> None:
        self.log, self.method, self.request = log, method, request
        self.started = time.monotonic()
        self.answer: Any = None
        self.user = next((v for k, v in context.invocation_metadata() or () if k == USER_KEY), None)

    @classmethod
    def sampled(cls, log: AccessLog, method: str, request: Any, context: Context) -> _CallLog | None:
        return cls(log, method, request, context) if log.sampled() else None

    def __enter__(self) -> _CallLog:
        return self

    def __exit__(self, kind: object, failure: BaseException | None, trace: object) -> None:
        status, reason = _outcome(failure)
        request, answer = self.request, self.answer
        refused = isinstance(request, Refused)
        line: dict[str, Any] = {
            "method": self.method,
            "model": request.model or None,
            "request_id": None if refused else request.request_id,
            "status": status,
            "reason": reason or None,
            "queue_ms": round(ADMISSION_WAIT.get() * 1000, 3),
            "duration_ms": round((time.monotonic() - self.started) * 1000, 3),
        }
        if self.user is not None:
            line["user"] = clip(self.user, USER_LOG_LIMIT)
        if (tenant := CALLER.get()) is not None:
            line["tenant"] = tenant.name
        fields = answer.DESCRIPTOR.fields_by_name if answer is not None else {}
        if "outputs" in fields and "timings" in fields:  # an Infer answer (a v2 answer has no timings)
            timings = answer.timings
            line["queue_ms"] = round(timings.queue_wait.ToNanoseconds() / 1e6, 3)
            line["compute_ms"] = round(timings.compute.ToNanoseconds() / 1e6, 3)
            line["batch_size"] = timings.batch_size
        elif "usage" in fields:  # a Generate stream's last message
            if answer.HasField("error"):
                line["status"], line["reason"] = (
                    _CODE_NAMES.get(answer.error.code, "UNKNOWN"),
                    answer.error.reason,
                )
            line["prompt_tokens"] = answer.usage.prompt_tokens
            line["tokens"] = answer.usage.completion_tokens
            line["finish_reason"] = answer.finish_reason
            if answer.HasField("timings"):
                timings = answer.timings
                line["queue_ms"] = round(timings.queue_wait.ToNanoseconds() / 1e6, 3)
                line["ttft_ms"] = round(timings.time_to_first_token.ToNanoseconds() / 1e6, 3)
                line["decode_ms"] = round(timings.decode.ToNanoseconds() / 1e6, 3)
        self.log.write(**line)
