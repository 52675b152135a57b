"""process/otlp_wire.py: what it writes parses as opentelemetry-proto's ExportTraceServiceRequest with every
field of the record in place (the call span continuing the caller's traceparent, its children, events,
error status, attribute types), and its sampler decides as the SDK's ParentBased(TraceIdRatioBased)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from process.otlp_wire import SpanEncoder

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def decode(encoder: SpanEncoder, records: list[tuple[Any, ...]]) -> list[trace_pb2.Span]:
    request = ExportTraceServiceRequest.FromString(encoder.request(encoder.spans(records)))
    (resource_spans,) = request.resource_spans
    assert [(a.key, a.value.string_value) for a in resource_spans.resource.attributes] == [
        ("service.name", "sluice-test")
    ]
    (scope_spans,) = resource_spans.scope_spans
    assert scope_spans.scope.name == "sluice"
    return list(scope_spans.spans)


def value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    return [value(x) for x in v.array_value.values] if which == "array_value" else getattr(v, which)


def record(parent: str = "", **fields: Any) -> tuple[Any, ...]:
    return (
        fields.get("name", "svc/Generate"), parent, fields.get("state", ""), 1, 100, 900,
        fields.get("attributes", {}), fields.get("error"), fields.get("events", []),
        fields.get("children", []),
    )  # fmt: skip


def test_a_record_becomes_the_call_span_and_its_children() -> None:
    attributes = {
        "rpc.method": "svc/Generate", "big": "é" * 3000, "n": 2**40, "negative": -3, "ok": True,
        "ratio": 0.25, "finish": ["stop", "length"],
    }  # fmt: skip
    children = [
        ("sluice.admission", 100, 150, {"sluice.queue_wait_s": 0.05}, None),
        ("refused", 150, 160, {}, "X"),
    ]
    events = [("cancelled", 800, {"by": "caller"})]
    parent = f"00-{TRACE}-{SPAN}-01"
    spans = decode(
        SpanEncoder("sluice-test", sampling_ratio=0.0),  # a sampled parent is followed whatever the ratio
        [
            record(
                parent, state="k=v", attributes=attributes, error="INTERNAL", events=events, children=children
            )
        ],
    )
    call, admission, refused = spans
    assert (call.name, call.trace_id.hex(), call.parent_span_id.hex()) == ("svc/Generate", TRACE, SPAN)
    assert (call.kind, call.start_time_unix_nano, call.end_time_unix_nano) == (2, 100, 900)  # SERVER
    assert {a.key: value(a.value) for a in call.attributes} == attributes
    assert call.trace_state == "k=v" and call.flags == 0x301  # sampled, its parent remote
    assert (call.status.code, call.status.message) == (trace_pb2.Status.STATUS_CODE_ERROR, "INTERNAL")
    assert [(e.name, e.time_unix_nano, e.attributes[0].value.string_value) for e in call.events] == [
        ("cancelled", 800, "caller")
    ]
    assert len(call.span_id) == 8 and call.span_id != bytes(8)
    for child in (admission, refused):
        assert child.trace_id == call.trace_id and child.parent_span_id == call.span_id
        assert child.kind == 1 and child.flags == 0x101 and child.trace_state == "k=v"  # INTERNAL
    assert (admission.start_time_unix_nano, admission.end_time_unix_nano) == (100, 150)
    assert admission.attributes[0].value.double_value == 0.05
    assert admission.status.code == trace_pb2.Status.STATUS_CODE_UNSET
    assert refused.status.code == trace_pb2.Status.STATUS_CODE_ERROR and refused.status.message == "X"


def test_a_call_without_a_valid_traceparent_starts_a_trace_of_its_own() -> None:
    encoder = SpanEncoder("sluice-test", sampling_ratio=1.0)
    invalid = [
        "", "garbage", f"ff-{TRACE}-{SPAN}-01", f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE}-{SPAN}-01-extra", f"00-{TRACE.upper()}-{SPAN}-01",
    ]  # fmt: skip
    spans = decode(encoder, [record(p) for p in invalid])
    assert len(spans) == len(invalid)
    assert all(s.parent_span_id == b"" and s.trace_id.hex() != TRACE and s.flags == 0x101 for s in spans)
    assert len({s.trace_id for s in spans}) == len(invalid)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 1.0])
def test_sampling_decides_as_the_sdks_parent_based_ratio_sampler(ratio: float) -> None:
    encoder = SpanEncoder("sluice-test", sampling_ratio=ratio, rng=random.Random(7))
    sdk = ParentBased(TraceIdRatioBased(ratio))
    rng = random.Random(11)
    parents = [f"00-{rng.getrandbits(128):032x}-{SPAN}-{rng.choice(['00', '01'])}" for _ in range(200)]
    parents += [""] * 2000
    kept = decode(encoder, [record(p) for p in parents])
    followed = [p for p in parents if p]
    assert sum(1 for s in kept if s.parent_span_id) == sum(p.endswith("-01") for p in followed)
    for span in kept:  # every root kept is one the SDK's sampler keeps for that trace id
        if not span.parent_span_id:
            decision = sdk.should_sample(None, int.from_bytes(span.trace_id, "big"), "x")
            assert decision.decision.is_sampled()
    roots = sum(1 for s in kept if not s.parent_span_id)
    assert abs(roots - ratio * 2000) <= 4 * (2000 * ratio * (1 - ratio)) ** 0.5


def test_the_sdks_propagator_reads_the_same_parent() -> None:
    parent = f"00-{TRACE}-{SPAN}-01"
    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    from opentelemetry import trace

    expected = trace.get_current_span(context).get_span_context()
    (span,) = decode(SpanEncoder("sluice-test", sampling_ratio=1.0), [record(parent)])
    assert int.from_bytes(span.trace_id, "big") == expected.trace_id
    assert int.from_bytes(span.parent_span_id, "big") == expected.span_id
