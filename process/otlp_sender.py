"""The export process's OTLP/gRPC client (CollectorSender): encoded ExportTraceServiceRequests wait in a
bounded queue for one thread that sends them with the collector's headers, compression and certificates
(process/otlp_target.py), retrying transient failures with a bounded backoff; what becomes of each request's
spans (`exported`, or the reason they were dropped) is reported, and the server counts it on /metrics.

Bounds, so that a collector that is away costs spans and never the server's memory or time:
- QUEUED requests wait (each at most BATCH spans of ~400 bytes: ~28 MB with the one in flight at worst);
  a request that does not fit is dropped at once (`queue_full`), and the pipe keeps being read.
- A request is tried at most ATTEMPTS times, waiting 0.25 s, 0.5 s, 1 s, 2 s between tries (doubling,
  capped at MAX_BACKOFF_S, +-20 % jitter), or the delay the collector's RetryInfo asks for, capped alike;
  never past RETRY_BUDGET_S after its first try, nor past the close's deadline. Then it is dropped
  (`export_failed`), as is a request refused with a code that is not transient.
- Transient, as the OTLP specification lists them: UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED, ABORTED,
  OUT_OF_RANGE, DATA_LOSS, and RESOURCE_EXHAUSTED only when the collector sent RetryInfo (otherwise it
  is the collector saying no, and a retry would only add load).
"""

from __future__ import annotations

import math
import queue
import random
import sys
import threading
import time
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError
from google.rpc.error_details_pb2 import RetryInfo

from process.otlp_target import CollectorTarget

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
BATCH = 4096  # spans per request (~400 bytes each: well under a collector's 4 MiB message limit)
QUEUED = 16  # requests that may wait for the collector
ATTEMPTS = 5
FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 4.0
RETRY_BUDGET_S = 15.0
_RETRY_INFO = "google.rpc.retryinfo-bin"
# Where a span may be lost in the export process (trace_export.py adds the server's side).
QUEUE_FULL, EXPORT_FAILED, SHUTDOWN = "queue_full", "export_failed", "shutdown"
EXPORTED = "exported"
Report = Callable[[str, int], None]  # (EXPORTED or a drop reason, spans)
_TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # only with RetryInfo: see retry_delay
    }
)


class CollectorSender:
    """`send` (the thread reading the pipe) queues a request; a thread of its own delivers it."""

    def __init__(self, collector: CollectorTarget, report: Report) -> None:
        # Reconnect within MAX_BACKOFF_S of a collector coming back (gRPC's default waits up to 120 s).
        options = [
            ("grpc.initial_reconnect_backoff_ms", int(FIRST_BACKOFF_S * 1000)),
            ("grpc.min_reconnect_backoff_ms", int(FIRST_BACKOFF_S * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000)),
        ]
        compression = grpc.Compression.Gzip if collector.compression == "gzip" else None
        if collector.secure:
            credentials = grpc.ssl_channel_credentials(
                collector.certificate, collector.client_key, collector.client_certificate
            )
            self._channel = grpc.secure_channel(collector.target, credentials, options, compression)
        else:
            self._channel = grpc.insecure_channel(collector.target, options, compression)
        self._export = self._channel.unary_unary(_EXPORT, None, None)  # already encoded: bytes in, bytes out
        self._metadata = collector.headers or None
        self._timeout_s = collector.timeout_s
        self._report = report
        self._queue: queue.Queue[tuple[bytes, int] | None] = queue.Queue(QUEUED)
        self._closing = threading.Event()
        self._deadline = math.inf  # set by close: no retry waits past it
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def send(self, request: bytes, spans: int) -> None:
        try:
            self._queue.put_nowait((request, spans))
        except queue.Full:
            self._drop(QUEUE_FULL, spans)

    def _drop(self, reason: str, spans: int) -> None:
        self.dropped += spans
        self._report(reason, spans)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            request, spans = item
            if self._deliver(request):
                self._report(EXPORTED, spans)
            else:
                self._drop(EXPORT_FAILED, spans)

    def _deliver(self, request: bytes) -> bool:
        give_up = time.monotonic() + RETRY_BUDGET_S
        for attempt in range(ATTEMPTS):
            try:
                self._export(request, timeout=self._timeout_s, metadata=self._metadata)
                return True
            except grpc.RpcError as error:
                delay = retry_delay(error, attempt)
            if delay is None or attempt + 1 == ATTEMPTS:
                return False
            wake_at = time.monotonic() + delay
            if wake_at > min(give_up, self._deadline):
                return False
            if self._closing.wait(delay):  # closing: finish this wait only if it ends before the deadline
                if wake_at > self._deadline:
                    return False
                time.sleep(max(wake_at - time.monotonic(), 0.0))
        return False

    def close(self, wait_s: float) -> None:
        """What is queued goes out within `wait_s`; the rest is dropped (`shutdown`) with the process."""
        self._deadline = time.monotonic() + wait_s
        self._closing.set()
        try:
            self._queue.put(None, timeout=wait_s)
            self._thread.join(max(self._deadline - time.monotonic(), 0.0))
        except queue.Full:
            pass
        if self._thread.is_alive():  # the collector held the requests past `wait_s`
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._drop(SHUTDOWN, item[1])
        self._channel.close()
        if self.dropped:  # once, as the process ends (the server's /metrics had them as they happened)
            print(f"trace export: {self.dropped} spans dropped", file=sys.stderr, flush=True)


def retry_delay(error: object, attempt: int) -> float | None:
    """Seconds to wait before trying again after `error` on try `attempt` (0-based); None: do not retry."""
    code = getattr(error, "code", lambda: None)()
    asked: float | None = None
    trailers = getattr(error, "trailing_metadata", lambda: None)() or ()
    for key, value in trailers:
        if key == _RETRY_INFO and isinstance(value, bytes):
            try:
                info = RetryInfo.FromString(value)
            except DecodeError:  # a collector's garbage is no delay
                continue
            asked = max(info.retry_delay.seconds + info.retry_delay.nanos / 1e9, 0.0)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and asked is None:
        return None
    if code not in _TRANSIENT:
        return None
    if asked is not None:
        return min(asked, MAX_BACKOFF_S)
    return float(min(FIRST_BACKOFF_S * 2**attempt, MAX_BACKOFF_S) * random.uniform(0.8, 1.2))
