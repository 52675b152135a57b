"""Spans made and exported in a process of their own: the server's event loop only appends a call record (a
tuple of names, nanosecond times and attributes) to a list; a thread hands the records to the export
process in batches, over a pipe, as marshal frames; that process makes the spans with the OpenTelemetry
SDK (its sampler decides) and exports them through the SDK's BatchSpanProcessor and OTLP/gRPC exporter.

Why a process: made and exported in the server, a span costs ~20 us on the event loop and ~40 us more in
the export thread, under the same GIL; an Infer call is ~600 us in all, so at sampling 1.0 tracing took a
tenth of the server's throughput (bench.tracing). A record costs a few microseconds.

A record: (name, traceparent, tracestate, kind, start_ns, end_ns, attributes, error, events, children), with
events (name, ns, attributes) and children (name, start_ns, end_ns, attributes, error); error is the
status description of a span that failed, or None. Records past MAX_PENDING wait for the pipe are dropped.

    python -m process.trace_export --endpoint HOST:PORT --sampling-ratio R --service NAME   (stdin: frames)
"""

from __future__ import annotations

import argparse
import marshal
import struct
import subprocess
import sys
import threading
from typing import IO, Any

Record = tuple[Any, ...]
MAX_PENDING = 65536  # records waiting for the pipe; beyond, new ones are dropped (a wedged export process)
_FLUSH_S = 0.2
_FRAME = struct.Struct("<I")


class SpanRecords:
    """The server's side: `add` (event loop) and a flusher thread writing frames to the export process."""

    def __init__(self, endpoint: str, *, sampling_ratio: float, service: str) -> None:
        # No preexec_fn: Python then starts the child with vfork/posix_spawn, which runs no fork handlers
        # (gRPC's restart its poller between fork and exec, and abort now and then).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "process.trace_export", "--endpoint", endpoint,
             "--sampling-ratio", repr(sampling_ratio), "--service", service],
            stdin=subprocess.PIPE,
        )  # fmt: skip
        self.dropped = 0
        self._pending: list[Record] = []
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._run, name="span-records", daemon=True)
        self._flusher.start()

    def add(self, record: Record) -> None:
        if len(self._pending) < MAX_PENDING:
            self._pending.append(record)
        else:
            self.dropped += 1

    def _run(self) -> None:
        pipe = self.process.stdin
        assert pipe is not None
        while not self._stop.wait(_FLUSH_S):
            if not self._write(pipe):
                return
        self._write(pipe)
        pipe.close()

    def _write(self, pipe: IO[bytes]) -> bool:
        batch, self._pending = self._pending, []  # one swap: the event loop appends to the new list
        if not batch:
            return True
        payload = marshal.dumps(batch)
        try:
            pipe.write(_FRAME.pack(len(payload)) + payload)
            pipe.flush()
        except (BrokenPipeError, ValueError, OSError):  # the export process has gone: spans are dropped
            self.dropped += len(batch)
            return False
        return True

    def shutdown(self, wait_s: float) -> None:
        """The records still pending go out; the export process exports them and exits, within `wait_s`."""
        self._stop.set()
        self._flusher.join(wait_s / 2)
        try:
            self.process.wait(wait_s / 2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _spans(tracer: Any, records: list[Record]) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from process.tracing import extract

    for name, parent, state, kind, start, end, attributes, error, events, children in records:
        carrier = {"traceparent": parent, **({"tracestate": state} if state else {})} if parent else {}
        span = tracer.start_span(
            name, context=extract(carrier), kind=SpanKind(kind), start_time=start, attributes=attributes
        )
        if span.is_recording():
            inside = trace.set_span_in_context(span)
            for child, child_start, child_end, child_attributes, child_error in children:
                made = tracer.start_span(
                    child, context=inside, start_time=child_start, attributes=child_attributes
                )
                if child_error:
                    made.set_status(Status(StatusCode.ERROR, child_error))
                made.end(end_time=child_end)
            for event, at, event_attributes in events:
                span.add_event(event, event_attributes, timestamp=at)
            if error:
                span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m process.trace_export")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--sampling-ratio", type=float, required=True)
    parser.add_argument("--service", required=True)
    args = parser.parse_args()
    from process.tracing import start_tracing

    tracing = start_tracing(args.endpoint, sampling_ratio=args.sampling_ratio, service=args.service)
    frames = sys.stdin.buffer
    while header := frames.read(_FRAME.size):
        if len(header) < _FRAME.size:
            break
        (size,) = _FRAME.unpack(header)
        payload = frames.read(size)
        if len(payload) < size:
            break
        _spans(tracing.tracer, marshal.loads(payload))
    tracing.shutdown(wait_s=5.0)  # stdin closed: the server is stopping, or gone


if __name__ == "__main__":
    main()
