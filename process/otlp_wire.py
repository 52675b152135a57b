"""The server's call records (process/trace_export.py) as OTLP: the sampler's decision for each record, and
the `ExportTraceServiceRequest` of the spans it keeps, written field by field in protobuf's wire format.

Why by hand: made as the SDK's span objects and encoded by its OTLP exporter, an Infer call's span cost
the export process ~120 us of CPU; built as opentelemetry-proto's messages, ~27 us; written here, ~13 us
(AMD EPYC). On two cores that process competes with the server for the same CPU, so its cost per call is
the throughput tracing takes (issue 22's bar: 0.95). The field numbers are opentelemetry-proto's
(trace.proto, common.proto, resource.proto, trace_service.proto); the tests parse what this writes with
those messages.

Sampling is the SDK's ParentBased(TraceIdRatioBased(ratio)): a call whose traceparent is valid follows its
sampled flag; any other starts a trace, kept when the trace id's low 64 bits fall below ratio * 2**64.
"""

from __future__ import annotations

import random
import re
import struct
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

# W3C trace context, as the SDK's propagator reads it.
_TRACEPARENT = re.compile(r"^\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*$")
_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16
_TRACESTATE_MAX = 512  # W3C: at most 32 members of at most 256 bytes; a longer one is not forwarded
_LOW64 = (1 << 64) - 1
_DOUBLE, _FIXED64, _FIXED32 = struct.Struct("<d"), struct.Struct("<Q"), struct.Struct("<I")
# Span.flags (field 16, fixed32): the sampled bit, and HAS_IS_REMOTE with IS_REMOTE where the parent is
# the caller's.
_FLAGS_TAG = b"\x85\x01"
_LOCAL = _FLAGS_TAG + _FIXED32.pack(0x101)
_REMOTE = _FLAGS_TAG + _FIXED32.pack(0x301)
_INTERNAL = 1  # SPAN_KIND_INTERNAL; a record's kind is the API's SpanKind, one less than OTLP's
_STATUS_ERROR = b"\x18\x02"  # Status.code = STATUS_CODE_ERROR


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(n) for n in range(2048)]


def _delimited(payload: bytes) -> bytes:
    n = len(payload)
    return (_SMALL[n] if n < 2048 else _varint(n)) + payload


def _any(value: Any) -> bytes:
    """An AnyValue: string 1, bool 2, int 3, double 4, array 5 (an ArrayValue of AnyValues, field 1)."""
    if isinstance(value, str):
        return b"\x0a" + _delimited(value.encode("utf-8", "replace"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & _LOW64)  # int64 as protobuf writes it: two's complement
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, (list, tuple)):
        return b"\x2a" + _delimited(b"".join(b"\x0a" + _delimited(_any(v)) for v in value))
    return _any(str(value))


@lru_cache(maxsize=1024)  # attribute names are the server's constants: each is encoded once
def _key(name: str) -> bytes:
    return b"\x0a" + _delimited(name.encode())


def _attributes(tag: bytes, attributes: dict[str, Any]) -> bytes:
    """Repeated KeyValue (key 1, value 2) under `tag`."""
    return b"".join(tag + _delimited(_key(k) + b"\x12" + _delimited(_any(v))) for k, v in attributes.items())


def _span(
    trace: bytes, span: bytes, parent: bytes, state: bytes, name: str, kind: int,
    start: int, end: int, attributes: dict[str, Any], events: Iterable[Sequence[Any]], error: str | None,
    flags: bytes,
) -> bytes:  # fmt: skip
    parts = [b"\x0a\x10", trace, b"\x12\x08", span]
    if state:
        parts += (b"\x1a", state)
    if parent:
        parts += (b"\x22\x08", parent)
    parts += (b"\x2a", _delimited(name.encode()), b"\x30", _SMALL[kind])
    parts += (b"\x39", _FIXED64.pack(start), b"\x41", _FIXED64.pack(end), _attributes(b"\x4a", attributes))
    for event, at, event_attributes in events:  # Event: time 1, name 2, attributes 3
        body = b"\x09" + _FIXED64.pack(at) + b"\x12" + _delimited(event.encode())
        parts += (b"\x5a", _delimited(body + _attributes(b"\x1a", event_attributes)))
    if error is not None:  # Status: message 2, code 3
        parts += (b"\x7a", _delimited(b"\x12" + _delimited(error.encode()) + _STATUS_ERROR))
    parts.append(flags)
    return b"\x12" + _delimited(b"".join(parts))  # as ScopeSpans.spans (field 2)


class SpanEncoder:
    """Records in, ExportTraceServiceRequest bytes out, for one service."""

    def __init__(self, service: str, *, sampling_ratio: float, rng: random.Random | None = None) -> None:
        self._bound = round(min(max(sampling_ratio, 0.0), 1.0) * (1 << 64))
        self._bits = (rng or random.Random()).getrandbits
        resource = b"\x0a" + _delimited(_key("service.name") + b"\x12" + _delimited(_any(service)))
        scope = b"\x0a" + _delimited(b"\x0a" + _delimited(b"sluice"))
        self._resource = b"\x0a" + _delimited(resource)  # ResourceSpans.resource: Resource.attributes
        self._scope = scope  # ScopeSpans.scope: InstrumentationScope.name

    def _context(self, parent: str, state: str) -> tuple[bytes, bytes, bytes, bytes] | None:
        """(trace id, parent span id, trace state, flags) of a sampled record; None if not sampled."""
        match = _TRACEPARENT.match(parent) if parent else None
        if match is not None:
            version, trace, span, flags, rest = match.groups()
            if version != "ff" and not (version == "00" and rest) and trace != _NO_TRACE and span != _NO_SPAN:
                if not int(flags, 16) & 1:
                    return None
                kept = state.encode() if len(state) <= _TRACESTATE_MAX else b""
                return bytes.fromhex(trace), bytes.fromhex(span), _delimited(kept) if kept else b"", _REMOTE
        trace_id = self._bits(128) or 1
        if trace_id & _LOW64 >= self._bound:
            return None
        return trace_id.to_bytes(16, "big"), b"", b"", _LOCAL

    def _span_id(self) -> bytes:
        return (self._bits(64) or 1).to_bytes(8, "big")

    def spans(self, records: Iterable[Sequence[Any]]) -> list[bytes]:
        """The encoded spans of the sampled records: each call span, then its children."""
        out: list[bytes] = []
        for name, parent, state, kind, start, end, attributes, error, events, children in records:
            context = self._context(parent, state)
            if context is None:
                continue
            trace, parent_id, trace_state, flags = context
            span_id = self._span_id()
            out.append(
                _span(trace, span_id, parent_id, trace_state, name, kind + 1, start, end, attributes,
                      events, error, flags)
            )  # fmt: skip
            for child, child_start, child_end, child_attributes, child_error in children:
                out.append(
                    _span(trace, self._span_id(), span_id, trace_state, child, _INTERNAL, child_start,
                          child_end, child_attributes, (), child_error, _LOCAL)
                )  # fmt: skip
        return out

    def request(self, spans: Sequence[bytes]) -> bytes:
        """One ExportTraceServiceRequest (resource_spans, field 1) of these spans."""
        scope_spans = b"\x12" + _delimited(self._scope + b"".join(spans))
        return b"\x0a" + _delimited(self._resource + scope_spans)
