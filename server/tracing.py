"""The spans of one guarded call (Infer, Generate), built from the times the server stamps anyway: the call's
arrival and admission (handlers), the queue wait, prefill, decode and batch that its answer reports
(GenerateTimings, Timings). The call span continues the caller's `traceparent` from the gRPC metadata.
As the call ends, one record of the span and its children, with their start and end times, goes to the
export process (process/trace_export.py), which writes them as OTLP: nothing is added to the
scheduler's loop, no span is made per token, and the event loop spends a few microseconds a call.

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

from process.tracing import Tracing
from wire.metadata import INFERENCE_SERVICE, TRACEPARENT, TRACESTATE

# Server-side gRPC codes that are the server's failure, not the caller's (OpenTelemetry's gRPC conventions).
_SERVER_ERRORS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE"})
_FINISH = {1: "length", 2: "stop", 3: "cancelled", 4: "error"}
_SERVER = 1  # opentelemetry.trace.SpanKind.SERVER's value (the export process makes the span)
Outcome = Callable[[BaseException | None], tuple[str, str]]


class CallTracer:
    """Hands each guarded call its CallTrace; made only while tracing is on, so a server without it
    pays one `is None` per call."""

    def __init__(self, tracing: Tracing, outcome: Outcome) -> None:
        self.tracing = tracing
        self.outcome = outcome  # (status, reason) of a call that raised this (None: it returned)
        self.records = tracing.records

    def call(self, method: str, request: Any, context: Any) -> CallTrace:
        return CallTrace(self, method, request, context.invocation_metadata() or ())


class CallTrace:
    """One call: its arrival, admission and answer noted as it runs, and, as it ends, one record of its
    span and children for the export process (process/trace_export.py), which writes them as OTLP."""

    __slots__ = ("admitted", "answer", "metadata", "method", "owner", "request", "started", "wait")

    def __init__(self, owner: CallTracer, method: str, request: Any, metadata: Any) -> None:
        self.owner, self.method, self.request, self.metadata = owner, method, request, metadata
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
        epoch = self.owner.tracing.epoch_ns
        name = f"{INFERENCE_SERVICE}/{self.method}"
        attributes: dict[str, Any] = {
            "rpc.system.name": "grpc",
            "rpc.method": name,
            "rpc.response.status_code": status,
        }
        model = getattr(self.request, "model", "")
        if model:
            attributes["gen_ai.request.model"] = model
        if status != "OK":
            attributes["error.type"] = reason or status
        children: list[tuple[Any, ...]] = []
        answer = self.answer
        if not self.admitted:  # refused (or gone) before it had a slot
            why = reason or status
            children.append(
                ("sluice.admission", epoch(self.started), epoch(now), {"sluice.refused_by": why}, why)
            )
        elif answer is not None and "outputs" in answer.DESCRIPTOR.fields_by_name:
            self._infer(attributes)
        else:
            children.append(
                (
                    "sluice.admission",
                    epoch(self.started),
                    epoch(self.admitted),
                    {"sluice.queue_wait_s": self.wait},
                    None,
                )
            )
            attributes.update(self._generate(children))
        events = []
        if status == "CANCELLED" or reason in ("STALLED_CONSUMER", "SHUTTING_DOWN"):
            events.append(("cancelled", epoch(now), {"by": "caller" if status == "CANCELLED" else "server"}))
        parent, state = "", ""
        for key, value in self.metadata:
            if key == TRACEPARENT:
                parent = value if isinstance(value, str) else value.decode("latin-1")
            elif key == TRACESTATE:
                state = value if isinstance(value, str) else value.decode("latin-1")
        error = (reason or status) if status in _SERVER_ERRORS else None
        self.owner.records.add(
            (
                name,
                parent,
                state,
                _SERVER,
                epoch(self.started),
                epoch(now),
                attributes,
                error,
                events,
                children,
            )
        )

    def _finished(self) -> bool:
        """The answer was a Generate stream's final message, finish reason and all."""
        answer = self.answer
        return (
            answer is not None
            and "finish_reason" in answer.DESCRIPTOR.fields_by_name
            and answer.finish_reason != 0
        )

    def _infer(self, attributes: dict[str, Any]) -> None:
        """An admitted Infer call is one span, its phases attributes: the whole call is ~0.6 ms of the
        server's CPU, and each span is one more for the export process to make and send."""
        t = self.answer.timings
        queue = t.queue_wait.ToNanoseconds() / 1e9
        attributes["gen_ai.latency.time_in_queue"] = queue
        attributes["sluice.queue_wait_s"] = self.wait
        attributes["sluice.batch.wait_s"] = max(queue - self.wait, 0.0)
        attributes["sluice.batch.size"] = t.batch_size
        attributes["sluice.compute_s"] = t.compute.ToNanoseconds() / 1e9

    def _generate(self, children: list[tuple[Any, ...]]) -> dict[str, Any]:
        """The children the final message's timings describe, placed from the moment the slot was given;
        returns the call span's GenAI attributes."""
        request, answer = self.request, self.answer
        attributes: dict[str, Any] = {}
        if hasattr(request, "sampling"):
            attributes["gen_ai.operation.name"] = (
                "chat" if request.WhichOneof("prompt") == "chat" else "text_completion"
            )
            if request.sampling.HasField("max_tokens"):
                attributes["gen_ai.request.max_tokens"] = request.sampling.max_tokens
        if (
            answer is None
            or "timings" not in answer.DESCRIPTOR.fields_by_name
            or not answer.HasField("timings")
        ):
            # a stream that ended before its last message, or an answer without timings (Tokenize)
            return attributes
        epoch = self.owner.tracing.epoch_ns
        base = self.admitted - self.wait  # where the response's clock starts
        t = answer.timings
        queue = t.queue_wait.ToNanoseconds() / 1e9
        first = t.time_to_first_token.ToNanoseconds() / 1e9
        decode = t.decode.ToNanoseconds() / 1e9
        joined = max(base + queue, self.admitted)
        batch = {"sluice.batch.step": t.first_step, "sluice.batch.size": t.batch_size}
        children.append(("sluice.batch", epoch(self.admitted), epoch(joined), batch, None))
        if first:
            prompt = {"gen_ai.usage.input_tokens": answer.usage.prompt_tokens}
            children.append(("sluice.prefill", epoch(joined), epoch(base + first), prompt, None))
            tokens = {"gen_ai.usage.output_tokens": t.tokens}
            children.append(
                ("sluice.decode", epoch(base + first), epoch(base + first + decode), tokens, None)
            )
        attributes.update(
            {
                "gen_ai.usage.input_tokens": answer.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": answer.usage.completion_tokens,
                "gen_ai.response.finish_reasons": [_FINISH.get(answer.finish_reason, "unspecified")],
                "gen_ai.latency.time_in_queue": queue,
                "gen_ai.latency.time_to_first_token": first,
                "gen_ai.latency.time_in_model_decode": decode,
            }
        )
        return attributes
