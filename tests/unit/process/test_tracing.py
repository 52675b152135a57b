"""process/tracing.py: off by default and free of the SDK; W3C trace context read from gRPC metadata and
ASGI headers alike (str or bytes, any case), and written back as the current span's."""

from __future__ import annotations

from opentelemetry import trace

from process.tracing import Tracing, extract_pairs, inject, start_tracing

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_without_an_endpoint_tracing_is_off_and_spans_do_not_record() -> None:
    off = start_tracing(None, sampling_ratio=1.0, service="test")
    assert not off.enabled
    assert not off.tracer.start_span("x").is_recording()
    off.shutdown(wait_s=0.1)  # nothing to stop


def test_trace_context_is_read_from_metadata_or_headers_and_written_back() -> None:
    header = f"00-{TRACE}-{SPAN}-01"
    for pairs in ([("traceparent", header)], [(b"TraceParent", header.encode())]):
        parent = trace.get_current_span(extract_pairs([("x-other", "1"), *pairs])).get_span_context()
        assert (format(parent.trace_id, "032x"), format(parent.span_id, "016x")) == (TRACE, SPAN)
        assert parent.trace_flags.sampled
        carrier: dict[str, str] = {}
        inject(carrier, extract_pairs(pairs))
        assert carrier == {"traceparent": header}
    assert not trace.get_current_span(extract_pairs([("x-other", "1")])).get_span_context().is_valid


def test_span_times_come_from_monotonic_stamps() -> None:
    tracing = Tracing.off()
    assert abs(tracing.epoch_ns(1.0) - tracing.epoch_ns(0.0) - 1_000_000_000) <= 1


def test_a_malformed_traceparent_starts_a_new_trace_instead_of_failing() -> None:
    for header in ("garbage", f"00-{'0' * 32}-{SPAN}-01", f"zz-{TRACE}-{SPAN}-01", "00-" + "x" * 200):
        context = extract_pairs([("traceparent", header)])
        assert not trace.get_current_span(context).get_span_context().is_valid
