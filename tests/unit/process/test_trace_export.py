"""process/trace_export.py: a call record becomes the SDK's spans (the call span continuing the caller's
traceparent, its children, events and error status), and the export process, handed records over its
pipe, exits once the pipe closes even with no collector to send to."""

from __future__ import annotations

import socket
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from process.trace_export import SpanRecords, _spans

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_a_record_becomes_the_call_span_and_its_children() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    children = [
        ("sluice.admission", 100, 150, {"sluice.queue_wait_s": 0.05}, None),
        ("refused", 150, 160, {}, "X"),
    ]
    events = [("cancelled", 800, {"by": "caller"})]
    parent = f"00-{TRACE}-{SPAN}-01"
    record = (
        "svc/Generate",
        parent,
        "",
        1,
        100,
        900,
        {"rpc.method": "svc/Generate"},
        "INTERNAL",
        events,
        children,
    )
    _spans(provider.get_tracer("test"), [record])
    spans = {s.name: s for s in exporter.get_finished_spans()}
    call = spans["svc/Generate"]
    assert format(call.context.trace_id, "032x") == TRACE and call.parent is not None
    assert format(call.parent.span_id, "016x") == SPAN
    assert (call.kind, call.start_time, call.end_time) == (SpanKind.SERVER, 100, 900)
    assert call.status.status_code == StatusCode.ERROR and [e.name for e in call.events] == ["cancelled"]
    admission = spans["sluice.admission"]
    assert admission.parent is not None and admission.parent.span_id == call.context.span_id
    assert (admission.start_time, admission.end_time) == (100, 150)
    assert spans["refused"].status.status_code == StatusCode.ERROR


def test_the_export_process_exits_when_its_pipe_closes_with_no_collector() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    records = SpanRecords(f"127.0.0.1:{closed}", sampling_ratio=1.0, service="test")
    for i in range(100):
        records.add(("svc/Infer", "", "", 1, i, i + 1, {"rpc.method": "svc/Infer"}, None, [], []))
    started = time.monotonic()
    records.shutdown(4.0)
    assert records.process.poll() is not None and time.monotonic() - started < 5
