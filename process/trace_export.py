"""Spans made and exported in a process of their own: the server's event loop only appends a call record (a
tuple of names, nanosecond times and attributes) to a list; a thread hands the records to the export
process in batches, over a pipe, as marshal frames; that process samples them as the SDK's parent-based
ratio sampler would, writes their spans as OTLP (process/otlp_wire.py) and sends them to the collector's
TraceService over gRPC.

Why a process: made and exported in the server, a span costs ~20 us on the event loop and ~40 us more in
the export thread, under the same GIL; an Infer call is ~600 us in all, so at sampling 1.0 tracing took a
tenth of the server's throughput (bench.tracing). A record costs a few microseconds. Why not the SDK in
that process: its span objects and OTLP encoder cost ~120 us per Infer call, on the cores the server runs
on; written directly, ~13 us (process/otlp_wire.py).

A record: (name, traceparent, tracestate, kind, start_ns, end_ns, attributes, error, events, children), with
events (name, ns, attributes) and children (name, start_ns, end_ns, attributes, error); error is the
status description of a span that failed, or None. Records past MAX_PENDING wait for the pipe are dropped.

    python -m process.trace_export --endpoint HOST:PORT --sampling-ratio R --service NAME   (stdin: frames)
"""

from __future__ import annotations

import argparse
import marshal
import queue
import struct
import subprocess
import sys
import threading
from typing import IO, Any

from process.otlp_wire import SpanEncoder

Record = tuple[Any, ...]
MAX_PENDING = 65536  # records waiting for the pipe; beyond, new ones are dropped (a wedged export process)
_FLUSH_S = 0.2
_FRAME = struct.Struct("<I")
_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_EXPORT_TIMEOUT_S = 5.0  # a collector that takes longer loses that request, not the process's time
# Spans per request (~400 bytes each: well under a collector's 4 MiB message limit), and requests that
# may wait for the collector; beyond, they are dropped.
_BATCH = 4096
_QUEUED = 16


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


class _Sender:
    """The export process's OTLP/gRPC client: requests wait in a short queue for a thread that sends them
    (already encoded: the channel's serializer is the identity); a collector that is down or slow costs
    the requests that do not fit, never the reading of the pipe."""

    def __init__(self, endpoint: str) -> None:
        import grpc

        target = endpoint.split("://", 1)[-1]
        if endpoint.startswith("https://"):
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials())
        else:
            self._channel = grpc.insecure_channel(target)
        self._export = self._channel.unary_unary(_EXPORT, None, None)  # bytes in, bytes out
        self._queue: queue.Queue[bytes | None] = queue.Queue(_QUEUED)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def send(self, request: bytes) -> None:
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        import grpc

        while (request := self._queue.get()) is not None:
            try:
                self._export(request, timeout=_EXPORT_TIMEOUT_S)
            except grpc.RpcError:  # the collector refused or is away: that batch is lost
                self.dropped += 1

    def close(self, wait_s: float) -> None:
        """What is queued goes out within `wait_s`; the rest is dropped with the process."""
        try:
            self._queue.put(None, timeout=wait_s)
            self._thread.join(wait_s)
        except queue.Full:  # the collector held every request past `wait_s`: the queued ones are lost
            self.dropped += self._queue.qsize()
        self._channel.close()
        if self.dropped:  # once, as the process ends: what the collector did not get
            print(f"trace export: {self.dropped} export requests dropped", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m process.trace_export")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--sampling-ratio", type=float, required=True)
    parser.add_argument("--service", required=True)
    args = parser.parse_args()
    encoder = SpanEncoder(args.service, sampling_ratio=args.sampling_ratio)
    sender = _Sender(args.endpoint)
    frames = sys.stdin.buffer
    while header := frames.read(_FRAME.size):
        if len(header) < _FRAME.size:
            break
        (size,) = _FRAME.unpack(header)
        payload = frames.read(size)
        if len(payload) < size:
            break
        spans = encoder.spans(marshal.loads(payload))
        for at in range(0, len(spans), _BATCH):
            sender.send(encoder.request(spans[at : at + _BATCH]))
    sender.close(wait_s=5.0)  # stdin closed: the server is stopping, or gone


if __name__ == "__main__":
    main()
