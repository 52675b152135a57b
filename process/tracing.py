"""OpenTelemetry tracing shared by the server and the shim: one tracer provider per process that exports over
OTLP/gRPC through the SDK's BatchSpanProcessor (a background thread: the event loop only appends a finished
span to a bounded queue, and a collector that is down or slow costs dropped spans, nothing else), a
parent-based ratio sampler (the first process to see a trace decides, the others follow its `sampled` flag),
and W3C trace context in and out of HTTP headers and gRPC metadata. The server's spans are sampled alike and
written as OTLP in an export process of their own, without the SDK (start_span_export, trace_export.py).

Off (no `--otlp-endpoint` and no OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, the default), `Tracing.off()` has
`enabled` False and every hook returns before it touches OpenTelemetry: no span objects, no context
look-ups, no thread. The provider is the
process's own, never the global one, so that tests may run several in one interpreter."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from process.otlp_target import resolve_endpoint, tls
from wire.metadata import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    from process.otlp_target import CollectorTarget

# The batch processor's period: spans of a quiet process reach the collector within half a second.
_EXPORT_DELAY_MS = 500.0
_EXPORT_TIMEOUT_S = 5.0  # a collector that takes longer loses that batch, not the process's time
# Finished spans held for export (past it they are dropped), and sent per export: at 1,400 Infer calls/s,
# three spans each, the defaults (2,048 and 512) dropped spans between two exports.
_QUEUE = 16384
_BATCH = 4096
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """The process's tracer, or the disabled one, or (the server's) `records`: spans handed to an export
    process as call records (process/trace_export.py). `epoch_ns(monotonic_s)` turns the monotonic stamps
    the server keeps into span times."""

    def __init__(self, tracer: trace.Tracer | None, provider: Any = None, *, records: Any = None) -> None:
        self.enabled = tracer is not None or records is not None
        self.tracer: trace.Tracer = tracer or trace.NoOpTracer()
        self.records = records
        self._provider = provider
        # Wall clock minus monotonic, once: span times from monotonic stamps without a clock read each.
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    def epoch_ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._offset_ns

    def shutdown(self, *, wait_s: float) -> None:
        """Exports what is queued and stops the export thread, waiting at most `wait_s`: a collector that
        is down must not hold up the process's exit (the export thread is a daemon)."""
        if self._provider is not None:
            stopping = threading.Thread(target=self._provider.shutdown, daemon=True, name="trace-shutdown")
            stopping.start()
            stopping.join(wait_s)
        if self.records is not None:
            self.records.shutdown(wait_s)


def start_tracing(endpoint: str | None, *, sampling_ratio: float, service: str) -> Tracing:
    """Tracing for this process: off without an endpoint. `endpoint` is the collector's OTLP/gRPC address,
    `host:port` or `http(s)://host:port` (plaintext unless https): `--otlp-endpoint`, else the standard
    variables' (process/otlp_target.py). The SDK's exporter reads the other OTEL_EXPORTER_OTLP_* itself."""
    endpoint = resolve_endpoint(endpoint)
    if not endpoint:
        return Tracing.off()
    # The SDK loads only when tracing is on: a server without it starts no thread and imports nothing more.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not tls(endpoint), timeout=_EXPORT_TIMEOUT_S)
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(sampling_ratio)),
        resource=Resource.create({"service.name": service}),
        shutdown_on_exit=False,  # the process shuts it down as it drains, not at interpreter exit
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=_QUEUE,
            max_export_batch_size=_BATCH,
            schedule_delay_millis=_EXPORT_DELAY_MS,
            export_timeout_millis=_EXPORT_TIMEOUT_S * 1000,
        )
    )
    return Tracing(provider.get_tracer("sluice"), provider)


def start_span_export(
    collector: CollectorTarget | None,
    *,
    sampling_ratio: float,
    service: str,
    report: Callable[[str, int], None] | None = None,
) -> Tracing:
    """As start_tracing, but the spans are made and exported in a process of their own from the call
    records this one hands it (the server's hot path: process/trace_export.py), to `collector`
    (process/otlp_target.py's collector_target); `report` is told what became of them (outcome, spans)."""
    if collector is None:
        return Tracing.off()
    from process.trace_export import SpanRecords

    records = SpanRecords(collector, sampling_ratio=sampling_ratio, service=service, report=report)
    return Tracing(None, records=records)


def extract(carrier: Mapping[str, str]) -> Context:
    """The caller's trace context from `traceparent`/`tracestate` (lower-case keys); empty if none."""
    return _PROPAGATOR.extract(carrier)


def extract_pairs(pairs: Iterable[tuple[str, str | bytes]]) -> Context:
    """As extract, from gRPC metadata or ASGI headers; other keys are not looked at."""
    carrier: dict[str, str] = {}
    for key, value in pairs:
        name = key if isinstance(key, str) else key.decode("latin-1")
        name = name.lower()
        if name in (TRACEPARENT, TRACESTATE):
            carrier[name] = value if isinstance(value, str) else value.decode("latin-1")
    return _PROPAGATOR.extract(carrier) if carrier else Context()


def inject(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    """Writes the current (or given) span's `traceparent` (and `tracestate`) into `carrier`."""
    _PROPAGATOR.inject(carrier, context)
