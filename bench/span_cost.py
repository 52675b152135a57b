"""What one traced Infer call costs, part by part (the README's OTLP paragraph): on the server's event loop,
the call record (server/tracing.py's CallTrace, appended for the export process) against an SDK span made
and ended in-process as the shim makes its own; in the export process, the record read from its pipe frame
and written as OTLP protobuf (process/otlp_wire.py) against the same span made with the SDK and encoded by
its OTLP encoder. Sampling 1.0, a caller's `traceparent`; microseconds of one thread's time per call, the
median of repeats with their range. bench.tracing measures the whole server with tracing on against off.

    .venv/bin/python -m bench.span_cost [--quick] [--repeats N] [--calls N]
"""

from __future__ import annotations

import argparse
import marshal
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from bench.shim_latency import cpu_model
from bench.stats import Spread
from process.otlp_wire import SpanEncoder
from process.tracing import Tracing
from server.tracing import CallTracer

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
NAME = "sluice.inference.v1.InferenceService/Infer"
METADATA = (("traceparent", PARENT), ("x-request-id", "bench"))


class Kept(list[tuple[Any, ...]]):
    """Stands in for SpanRecords: what the loop hands over, kept (the flusher thread is not timed)."""

    def add(self, record: tuple[Any, ...]) -> None:
        self.append(record)


def _call(tracer: CallTracer, request: pb.InferRequest, answer: pb.InferResponse) -> None:
    with tracer.call("Infer", request, SimpleNamespace(invocation_metadata=lambda: METADATA)) as trace:
        trace.admit(0.0002)
        trace.answer = answer


def _answer() -> tuple[pb.InferRequest, pb.InferResponse]:
    answer = pb.InferResponse(model="mlp", timings=pb.Timings(batch_size=32))
    answer.timings.queue_wait.FromNanoseconds(400_000)
    answer.timings.compute.FromNanoseconds(300_000)
    return pb.InferRequest(model="mlp"), answer


def records(calls: int) -> tuple[Callable[[], None], Kept]:
    """The server's side: one call record per Infer call."""
    kept = Kept()
    tracer = CallTracer(Tracing(None, records=kept), lambda failure: ("OK", ""))
    request, answer = _answer()
    return lambda: _call(tracer, request, answer), kept


def sdk_spans() -> tuple[Callable[[], None], Any]:
    """An SDK span per call, with the same attributes, ended into a processor that keeps it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    server_kind = SpanKind.SERVER

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("sluice")
    parent = TraceContextTextMapPropagator().extract({"traceparent": PARENT})
    attributes: dict[str, Any] = {
        "rpc.system.name": "grpc",
        "rpc.method": NAME,
        "rpc.response.status_code": "OK",
        "gen_ai.request.model": "mlp",
        "gen_ai.latency.time_in_queue": 0.0004,
        "sluice.queue_wait_s": 0.0002,
        "sluice.batch.wait_s": 0.0002,
        "sluice.batch.size": 32,
        "sluice.compute_s": 0.0003,
    }

    def call() -> None:
        span = tracer.start_span(NAME, context=parent, kind=server_kind)
        span.set_attributes(attributes)
        span.end()

    return call, exporter


def timed(call: Callable[[], object], calls: int) -> float:
    """Microseconds of this thread's CPU per call."""
    started = time.thread_time()
    for _ in range(calls):
        call()
    return (time.thread_time() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.span_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat of 2,000 calls")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20_000, help="calls per repeat")
    args = parser.parse_args()
    repeats, calls = (1, 2000) if args.quick else (args.repeats, args.calls)
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    encoder = SpanEncoder("sluice", sampling_ratio=1.0)
    loop, sdk, export, sdk_export = [], [], [], []
    for _ in range(repeats):
        record, kept = records(calls)
        loop.append(timed(record, calls))
        frames = iter([marshal.dumps(r) for r in kept])  # as the flusher writes them to the pipe
        export.append(timed(lambda: encoder.request(encoder.spans([marshal.loads(next(frames))])), calls))  # noqa: B023
        span, exporter = sdk_spans()
        sdk.append(timed(span, calls))
        ended = iter(exporter.get_finished_spans())
        sdk_export.append(timed(lambda: encode_spans([next(ended)]).SerializeToString(), calls))  # noqa: B023
    print(f"CPU: {cpu_model()}; {repeats} repeats of {calls:,} Infer calls")
    print("us of CPU per call, median [min-max]\n")
    print("| where | Sluice | with the OpenTelemetry SDK |\n|---|---|---|")
    loop_us, sdk_us = Spread.of(loop).format(1), Spread.of(sdk).format(1)
    print(f"| server event loop: the call's tracing | {loop_us} | {sdk_us} |")
    print(
        f"| export process: span written as OTLP | {Spread.of(export).format(1)} | "
        f"{Spread.of(sdk_export).format(1)} (+ the SDK span above, made there) |"
    )


if __name__ == "__main__":
    main()
