"""The spans of one guarded call (Infer, Generate), built from the times the server stamps anyway: the call's
arrival and admission (handlers), the queue wait, prefill, decode and batch that its answer reports
(GenerateTimings, Timings). The call span continues the caller's `traceparent` from the gRPC metadata;
its children are made as the call ends, with their own start and end times, so nothing is added to the
scheduler's loop and no span is made per token.

    <service>/<method>       SERVER: rpc.*, gen_ai.* (model, tokens, finish reason, vLLM's gen_ai.latency.*),
                             the outcome (rpc.response.status_code, error.type); event `cancelled`
      sluice.admission       arrival to a slot: the wait, or the reason of the policy that refused
      sluice.batch           slot to the first step the stream joined: the step number and its size
      sluice.prefill         that step to the first token
      sluice.decode          first token to last, with the token count

An Infer call that was admitted is the call span alone, its admission wait, batch wait and size and
forward pass as attributes (`sluice.*`): see CallTrace._infer.
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
    """One call: its arrival, admission and answer noted as it runs; its span (and children) made in one
    go as it ends, with the times noted. Nothing downstream on the server needs the span while the call
    runs, and one start_span with every attribute costs a third of a span opened early and added to."""

    __slots__ = ("admitted", "answer", "method", "owner", "parent", "request", "started", "wait")

    def __init__(self, owner: CallTracer, method: str, request: Any, parent: Any) -> None:
        self.owner, self.method, self.request, self.parent = owner, method, request, parent
        self.started = time.monotonic()
        self.admitted = 0.0
        self.wait = 0.0
        self.answer: Any = None

    def admit(self, wait_s: float) -> None:
        """The call has its slot, after waiting `wait_s` in the gate."""
        self.admitted, self.wait = time.monotonic(), wait_s

    def __enter__(self) -> CallTrace:
        return self

    def __exit__(self, kind: object, failure: BaseException | None, traceback: object) -> None:
        status, reason = self.owner.outcome(failure)
        if status == "CANCELLED" and self._finished():
            # The caller had the stream's last message and left before the trailers (the shim cancels a
            # call once it has read it whole): for the trace the call succeeded.
            status = "OK"
        now = time.monotonic()
        tracing = self.owner.tracing
        epoch, tracer = tracing.epoch_ns, tracing.tracer
        name = f"{INFERENCE_SERVICE}/{self.method}"
        done: dict[str, Any] = {
            "rpc.system.name": "grpc",
            "rpc.method": name,
            "rpc.response.status_code": status,
        }
        model = getattr(self.request, "model", "")
        if model:
            done["gen_ai.request.model"] = model
        if status != "OK":
            done["error.type"] = reason or status
        answer = self.answer
        infer = answer is not None and "outputs" in answer.DESCRIPTOR.fields_by_name
        if infer and self.admitted:
            self._infer(done)
        elif self.method == "Generate" and hasattr(self.request, "sampling"):
            done["gen_ai.operation.name"] = (
                "chat" if self.request.WhichOneof("prompt") == "chat" else "text_completion"
            )
            if self.request.sampling.HasField("max_tokens"):
                done["gen_ai.request.max_tokens"] = self.request.sampling.max_tokens
        span = tracer.start_span(
            name, context=self.parent, kind=SpanKind.SERVER, start_time=epoch(self.started), attributes=done
        )
        if not span.is_recording():  # not sampled: nothing more to build
            span.end()
            return
        inside = trace.set_span_in_context(span)

        def child(name: str, start: float, end: float, attributes: dict[str, Any], error: str = "") -> None:
            made = tracer.start_span(name, context=inside, start_time=epoch(start), attributes=attributes)
            if error:
                made.set_status(Status(StatusCode.ERROR, error))
            made.end(end_time=epoch(max(end, start)))

        if not self.admitted:  # refused (or gone) before it had a slot
            why = reason or status
            child("sluice.admission", self.started, now, {"sluice.refused_by": why}, error=why)
        elif not infer:
            child("sluice.admission", self.started, self.admitted, {"sluice.queue_wait_s": self.wait})
            span.set_attributes(self._generate(child))
        if status == "CANCELLED" or reason in ("STALLED_CONSUMER", "SHUTTING_DOWN"):
            span.add_event("cancelled", {"by": "caller" if status == "CANCELLED" else "server"})
        if status in _SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, reason or status))
        span.end(end_time=epoch(now))

    def _finished(self) -> bool:
        """The answer was a Generate stream's final message, finish reason and all."""
        answer = self.answer
        return (
            answer is not None
            and "finish_reason" in answer.DESCRIPTOR.fields_by_name
            and answer.finish_reason != 0
        )

    def _infer(self, done: dict[str, Any]) -> None:
        """An Infer call is one span: its phases are attributes. The whole call is ~0.6 ms of the server's
        CPU and a span ~45 us to make and export, so children would cost a fifth of the call."""
        t = self.answer.timings
        queue = t.queue_wait.ToNanoseconds() / 1e9
        done["gen_ai.latency.time_in_queue"] = queue
        done["sluice.queue_wait_s"] = self.wait
        done["sluice.batch.wait_s"] = max(queue - self.wait, 0.0)
        done["sluice.batch.size"] = t.batch_size
        done["sluice.compute_s"] = t.compute.ToNanoseconds() / 1e9

    def _generate(self, child: Callable[..., None]) -> dict[str, Any]:
        """The children the final message's timings describe, placed from the moment the slot was given;
        returns the call span's GenAI attributes."""
        answer, base = self.answer, self.admitted - self.wait  # base: where the response's clock starts
        if answer is None or not answer.HasField("timings"):  # a stream that ended before its last message
            return {}
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
            prompt = {"gen_ai.usage.input_tokens": answer.usage.prompt_tokens}
            child("sluice.prefill", base + queue, base + first, prompt)
            child(
                "sluice.decode", base + first, base + first + decode, {"gen_ai.usage.output_tokens": t.tokens}
            )
        return {
            "gen_ai.usage.input_tokens": answer.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": answer.usage.completion_tokens,
            "gen_ai.response.finish_reasons": [_FINISH.get(answer.finish_reason, "unspecified")],
            "gen_ai.latency.time_in_queue": queue,
            "gen_ai.latency.time_to_first_token": first,
            "gen_ai.latency.time_in_model_decode": decode,
        }
