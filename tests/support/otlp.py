"""An OTLP/gRPC trace receiver for tests: a real grpc server on a loopback port, in a process of its own
(`python -m tests.support.otlp`), that implements the collector's TraceService with the
`opentelemetry-proto` messages and prints every span it is sent as a JSON line the test reads.

Like a real collector it may be strict (`otlp_receiver(*options)`): `--require-header KEY=VALUE` refuses an
export without that metadata (UNAUTHENTICATED, as the collector's bearertokenauth does), `--unavailable N`
answers the first N exports UNAVAILABLE (a collector restarting), `--identity-only` turns gzip off (gRPC then
refuses a compressed request: UNIMPLEMENTED). Each refusal prints `REFUSED CODE`."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

from tests.support.processes import Process, spawn


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[str, ...]
    status_code: int


def _value(value: common_pb2.AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Prints each span it is sent as one `SPAN {json}` line, and each export it refuses as `REFUSED CODE`."""

    def __init__(self, required: tuple[str, str] | None, unavailable: int) -> None:
        self.required = required
        self.unavailable = unavailable
        self.lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        if self.required is not None and self.required not in tuple(context.invocation_metadata()):
            print("REFUSED UNAUTHENTICATED", flush=True)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"no {self.required[0]} header")
        with self.lock:
            self.unavailable -= 1
            refuse = self.unavailable >= 0
        if refuse:
            print("REFUSED UNAVAILABLE", flush=True)
            context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received = ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        events=tuple(e.name for e in span.events),
                        status_code=span.status.code,
                    )
                    print("SPAN " + json.dumps(asdict(received)), flush=True)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """The receiver process, and the spans it has printed so far."""

    def __init__(self, process: Process, port: int) -> None:
        self.process = process
        self.address = f"127.0.0.1:{port}"
        self.endpoint = f"http://{self.address}"

    def refused(self, code: str) -> int:
        """Exports refused so far with `code`."""
        return sum(1 for line in list(self.process.lines) if line == f"REFUSED {code}")

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        out = []
        for line in list(self.process.lines):
            if line.startswith("SPAN "):
                fields = json.loads(line.removeprefix("SPAN "))
                span = ReceivedSpan(**{**fields, "events": tuple(fields["events"])})
                if trace_id is None or span.trace_id == trace_id:
                    out.append(span)
        return out


@contextmanager
def otlp_receiver(*options: str) -> Iterator[OtlpReceiver]:
    """The receiver in a process of its own: a gRPC server running in the test process would make each
    child it forks afterwards restart gRPC's poller between fork and exec, which aborts now and then."""
    process = spawn("otlp", ["-m", "tests.support.otlp", *options])
    try:
        port = int(process.wait_for_line(r"otlp receiver listening on (\d+)").group(1))
        yield OtlpReceiver(process, port)
    finally:
        process.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.otlp")
    parser.add_argument("--require-header", metavar="KEY=VALUE")
    parser.add_argument("--unavailable", type=int, default=0)
    parser.add_argument("--identity-only", action="store_true")
    args = parser.parse_args()
    required = tuple(args.require_header.split("=", 1)) if args.require_header else None
    # Bit 0 alone: identity; gzip (bit 2) and deflate (bit 1) off.
    options = [("grpc.compression_enabled_algorithms_bitset", 1)] if args.identity_only else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=options)
    collector = _Collector(required, args.unavailable)  # type: ignore[arg-type]
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=None))
    print(f"otlp receiver listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
