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

The pipe's first frame is the collector (process/otlp_target.py: headers and keys never go on a command
line); the export process sends with retries and bounds of its own (process/otlp_sender.py) and writes one
line per outcome to its stdout (`exported N`, `queue_full N`, ...), which the server reads as it runs and
counts on /metrics, with its own drops (`buffer_full`, `exporter_gone`): DROP_REASONS.

    python -m process.trace_export --sampling-ratio R --service NAME   (stdin: frames; stdout: outcomes)
"""

from __future__ import annotations

import argparse
import marshal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

from process.otlp_sender import (
    BATCH,
    EXPORT_FAILED,
    EXPORTED,
    QUEUE_FULL,
    SHUTDOWN,
    CollectorSender,
    Report,
)
from process.otlp_target import CollectorTarget
from process.otlp_wire import SpanEncoder

Record = tuple[Any, ...]
MAX_PENDING = 65536  # records waiting for the pipe; beyond, new ones are dropped (a wedged export process)
_FLUSH_S = 0.2
_FRAME = struct.Struct("<I")
# The server's side: records past MAX_PENDING, and records the export process never got (it had gone).
BUFFER_FULL, EXPORTER_GONE = "buffer_full", "exporter_gone"
DROP_REASONS = (BUFFER_FULL, EXPORTER_GONE, QUEUE_FULL, EXPORT_FAILED, SHUTDOWN)


def _ignore(outcome: str, spans: int) -> None:
    pass


class SpanRecords:
    """The server's side: `add` (event loop), a flusher thread writing frames to the export process, and a
    thread reading back what became of them, for `report` (outcome, spans: EXPORTED or a DROP_REASONS)."""

    def __init__(
        self, collector: CollectorTarget, *, sampling_ratio: float, service: str, report: Report | None = None
    ) -> None:
        # No preexec_fn: Python then starts the child with vfork/posix_spawn, which runs no fork handlers
        # (gRPC's restart its poller between fork and exec, and abort now and then).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "process.trace_export", "--sampling-ratio", repr(sampling_ratio),
             "--service", service],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )  # fmt: skip
        self.dropped = 0
        self._reported_dropped = 0
        self._report = report or _ignore
        self._pending: list[Record] = []
        self._stop = threading.Event()
        assert self.process.stdin is not None and self.process.stdout is not None
        self._send_frame(self.process.stdin, marshal.dumps(collector.to_wire()))
        self._flusher = threading.Thread(target=self._run, name="span-records", daemon=True)
        self._flusher.start()
        self._reader = threading.Thread(
            target=self._read, args=(self.process.stdout,), name="span-outcomes", daemon=True
        )
        self._reader.start()

    def add(self, record: Record) -> None:
        if len(self._pending) < MAX_PENDING:
            self._pending.append(record)
        else:  # counted here, reported by the flusher: the event loop only adds
            self.dropped += 1 + len(record[-1])

    def _run(self) -> None:
        pipe: IO[bytes] | None = self.process.stdin
        while not self._stop.wait(_FLUSH_S):
            pipe = self._write(pipe)
        self._write(pipe)
        if pipe is not None:
            pipe.close()

    def _write(self, pipe: IO[bytes] | None) -> IO[bytes] | None:
        """Hands the pending records over; returns the pipe, or None once the export process has gone (its
        records are then counted as dropped every period, so that /metrics keeps saying so)."""
        if (new := self.dropped - self._reported_dropped) > 0:
            self._reported_dropped += new
            self._report(BUFFER_FULL, new)
        batch, self._pending = self._pending, []  # one swap: the event loop appends to the new list
        if not batch:
            return pipe
        if pipe is not None:
            try:
                self._send_frame(pipe, marshal.dumps(batch))
                return pipe
            except (BrokenPipeError, ValueError, OSError):
                pass
        self._report(EXPORTER_GONE, sum(1 + len(record[-1]) for record in batch))
        return None

    @staticmethod
    def _send_frame(pipe: IO[bytes], payload: bytes) -> None:
        pipe.write(_FRAME.pack(len(payload)) + payload)
        pipe.flush()

    def _read(self, lines: IO[bytes]) -> None:
        try:
            for line in lines:
                outcome, _, count = line.decode("ascii", "replace").strip().partition(" ")
                if count.isdigit() and (outcome == EXPORTED or outcome in DROP_REASONS):
                    self._report(outcome, int(count))
        except (OSError, ValueError):  # closed by shutdown
            return

    def shutdown(self, wait_s: float) -> None:
        """The records still pending go out; the export process exports them and exits, within `wait_s`."""
        self._stop.set()
        self._flusher.join(wait_s / 2)
        try:
            self.process.wait(wait_s / 2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(1.0)  # the last outcomes, written before the process exited
        if self.process.stdout is not None:
            self.process.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m process.trace_export")
    parser.add_argument("--sampling-ratio", type=float, required=True)
    parser.add_argument("--service", required=True)
    args = parser.parse_args()
    encoder = SpanEncoder(args.service, sampling_ratio=args.sampling_ratio)
    frames = _frames(sys.stdin.buffer)
    collector = next(frames, None)
    if collector is None:
        return
    sender = CollectorSender(CollectorTarget.from_wire(collector), _reporter(sys.stdout))
    for records in frames:
        spans = encoder.spans(records)
        for at in range(0, len(spans), BATCH):
            batch = spans[at : at + BATCH]
            sender.send(encoder.request(batch), len(batch))
    sender.close(wait_s=5.0)  # stdin closed: the server is stopping, or gone


def _frames(pipe: IO[bytes]) -> Iterator[Any]:
    while header := pipe.read(_FRAME.size):
        if len(header) < _FRAME.size:
            return
        (size,) = _FRAME.unpack(header)
        payload = pipe.read(size)
        if len(payload) < size:
            return
        yield marshal.loads(payload)


def _reporter(out: IO[str]) -> Report:
    """Writes `OUTCOME N` lines for the server; the pipe reader and the sender thread both report."""
    lock = threading.Lock()

    def report(outcome: str, spans: int) -> None:
        with lock:
            try:
                out.write(f"{outcome} {spans}\n")
                out.flush()
            except (OSError, ValueError):  # the server has gone: nobody to count for
                pass

    return report


if __name__ == "__main__":
    main()
