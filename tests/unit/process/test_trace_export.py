"""process/trace_export.py: the export process, handed records over its pipe, sends them to a collector as
OTLP, and exits once the pipe closes, even with no collector to send to (the spans' encoding:
test_otlp_wire.py)."""

from __future__ import annotations

import socket
import time

from process.otlp_target import CollectorTarget
from process.trace_export import SpanRecords
from tests.support.otlp import otlp_receiver


def test_the_export_process_exits_when_its_pipe_closes_with_no_collector() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    records = SpanRecords(CollectorTarget(f"127.0.0.1:{closed}", False), sampling_ratio=1.0, service="test")
    for i in range(100):
        records.add(("svc/Infer", "", "", 1, i, i + 1, {"rpc.method": "svc/Infer"}, None, [], []))
    started = time.monotonic()
    records.shutdown(4.0)
    assert records.process.poll() is not None and time.monotonic() - started < 5


def test_the_export_process_sends_every_record_to_the_collector() -> None:
    records_n = 5000  # more than one request's worth
    with otlp_receiver() as receiver:
        records = SpanRecords(CollectorTarget(receiver.address, False), sampling_ratio=1.0, service="test")
        for i in range(records_n):
            name = "svc/last" if i == records_n - 1 else "svc/Infer"
            records.add((name, "", "", 1, i, i + 1, {"rpc.method": "svc/Infer", "i": i}, None, [], []))
        records.shutdown(10.0)
        assert records.process.returncode == 0
        receiver.process.wait_for_line(r'"name": "svc/last"')
        spans = receiver.spans()
    assert sorted(s.attributes["i"] for s in spans) == list(range(records_n))
    assert {s.service for s in spans} == {"test"} and {s.kind for s in spans} == {2}
