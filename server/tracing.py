"""The spans of one guarded call (Infer, Generate), built from the times the server stamps anyway: the call's
arrival and admission (handlers), the queue wait, prefill, decode and batch that its answer reports
(GenerateTimings, Timings). The call span continues the caller's `traceparent` from the gRPC metadata;
its children are made as the call ends, with their own start and end times, so nothing is added to the
scheduler's loop and no span is made per token.

    <service>/<method>       SERVER: rpc.*, gen_ai.* (model, tokens, finish reason, vLLM's gen_ai.latency.*),
                             the outcome (rpc.response.status_code, error.type); event `cancelled`
      sluice.admission       arrival to a slot: the wait, or the reason of the policy that refused
      sluice.batch           slot to the first step (Generate: the step number and its size) or batch (Infer)
      sluice.prefill         that step to the first token (Generate)
      sluice.decode          first token to last, with the token count (Generate)
      sluice.compute         the batch's forward pass, with its size (Infer)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from process.tracing import Tracing, extract_pairs
from wire.metadata import INFERENCE_SERVICE

# Server-side gRPC codes that are the server's failure, not the caller's (OpenTelemetry's gRPC conventions).
_SERVER_ERRORS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE"})
_FINISH = {1: "length", 2: "stop", 3: "cancelled", 4: "error"}
Outcome = Callable[[BaseException | None], tuple[str, str]]


class CallTracer:
    """Hands each guarded call its CallTrace; made only while tracing is on, so a server without it
    pays one `is None` per call."""

    def __init__(self, tracing: Tracing, outcome: Outcome) -> None:
        self.tracing = tracing
        self.outcome = outcome  # (status, reason) of a call that raised this (None: it returned)

    def call(self, method: str, request: Any, context: Any) -> CallTrace:
        return CallTrace(self, method, request, extract_pairs(context.invocation_metadata() or ()))


class CallTrace:
    """One call's span, opened as the call arrives and ended, with its children, as the call ends."""

    __slots__ = ("admitted", "answer", "owner", "span", "started", "wait")

    def __init__(self, owner: CallTracer, method: str, request: Any, parent: Any) -> None:
        self.owner = owner
        self.started = time.monotonic()
        self.admitted = 0.0
        self.wait = 0.0
        self.answer: Any = None
        attributes: dict[str, Any] = {
            "rpc.system.name": "grpc",
            "rpc.method": f"{INFERENCE_SERVICE}/{method}",
            "gen_ai.provider.name": "sluice",
        }
        model = getattr(request, "model", "")
        if model:
            attributes["gen_ai.request.model"] = model
        if method == "Generate" and hasattr(request, "sampling"):
            attributes["gen_ai.operation.name"] = (
                "chat" if request.WhichOneof("prompt") == "chat" else "text_completion"
            )
            if request.sampling.HasField("max_tokens"):
                attributes["gen_ai.request.max_tokens"] = request.sampling.max_tokens
        self.span = owner.tracing.tracer.start_span(
            f"{INFERENCE_SERVICE}/{method}",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=owner.tracing.epoch_ns(self.started),
            attributes=attributes,
        )

    def admit(self, wait_s: float) -> None:
        """The call has its slot, after waiting `wait_s` in the gate."""
        self.admitted, self.wait = time.monotonic(), wait_s

    def __enter__(self) -> CallTrace:
        return self

    def __exit__(self, kind: object, failure: BaseException | None, traceback: object) -> None:
        span = self.span
        if not span.is_recording():  # not sampled: nothing to build
            span.end()
            return
        status, reason = self.owner.outcome(failure)
        now = time.monotonic()
        epoch = self.owner.tracing.epoch_ns
        inside = trace.set_span_in_context(span)
        tracer = self.owner.tracing.tracer

        def child(name: str, start: float, end: float, attributes: dict[str, Any], error: str = "") -> None:
            made = tracer.start_span(name, context=inside, start_time=epoch(start), attributes=attributes)
            if error:
                made.set_status(Status(StatusCode.ERROR, error))
            made.end(end_time=epoch(max(end, start)))

        if not self.admitted:  # refused (or gone) before it had a slot
            why = reason or status
            child("sluice.admission", self.started, now, {"sluice.refused_by": why}, error=why)
        else:
            child("sluice.admission", self.started, self.admitted, {"sluice.queue_wait_s": self.wait})
            self._answered(child, span)
        span.set_attribute("rpc.response.status_code", status)
        if status != "OK":
            span.set_attribute("error.type", reason or status)
        if status == "CANCELLED" or reason in ("STALLED_CONSUMER", "SHUTTING_DOWN"):
            span.add_event("cancelled", {"by": "caller" if status == "CANCELLED" else "server"})
        if status in _SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, reason or status))
        span.end(end_time=epoch(now))

    def _answered(self, child: Callable[..., None], span: trace.Span) -> None:
        """The children the answer's timings describe, placed from the moment the slot was given."""
        answer, base = self.answer, self.admitted - self.wait  # base: where the response's clock starts
        if answer is None:
            return
        if "outputs" in answer.DESCRIPTOR.fields_by_name:  # Infer
            t = answer.timings
            formed = base + t.queue_wait.ToNanoseconds() / 1e9
            child("sluice.batch", self.admitted, formed, {"sluice.batch.size": t.batch_size})
            computed = formed + t.compute.ToNanoseconds() / 1e9
            child("sluice.compute", formed, computed, {"sluice.batch.size": t.batch_size})
            span.set_attribute("gen_ai.latency.time_in_queue", t.queue_wait.ToNanoseconds() / 1e9)
            return
        if not answer.HasField("timings"):  # a stream that ended before its last message
            return
        t = answer.timings
        queue = t.queue_wait.ToNanoseconds() / 1e9
        first = t.time_to_first_token.ToNanoseconds() / 1e9
        decode = t.decode.ToNanoseconds() / 1e9
        child(
            "sluice.batch",
            self.admitted,
            base + queue,
            {"sluice.batch.step": t.first_step, "sluice.batch.size": t.batch_size},
        )
        if first:
            child(
                "sluice.prefill",
                base + queue,
                base + first,
                {"gen_ai.usage.input_tokens": answer.usage.prompt_tokens},
            )
            child(
                "sluice.decode",
                base + first,
                base + first + decode,
                {"gen_ai.usage.output_tokens": t.tokens},
            )
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": answer.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": answer.usage.completion_tokens,
                "gen_ai.response.finish_reasons": [_FINISH.get(answer.finish_reason, "unspecified")],
                "gen_ai.latency.time_in_queue": queue,
                "gen_ai.latency.time_to_first_token": first,
                "gen_ai.latency.time_in_model_decode": decode,
            }
        )
