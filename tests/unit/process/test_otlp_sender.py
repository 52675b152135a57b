"""process/otlp_sender.py: transient refusals are retried with a bounded, growing backoff (or the collector's
RetryInfo, capped), other refusals are not; a request is tried at most ATTEMPTS times; requests that do
not fit the queue are dropped at once, and closing never waits past its deadline. Against a real
receiver (tests/support/otlp.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo

from process.otlp_sender import ATTEMPTS, MAX_BACKOFF_S, QUEUED, CollectorSender, retry_delay
from process.otlp_target import CollectorTarget
from process.otlp_wire import SpanEncoder
from tests.support.otlp import otlp_receiver
from tests.support.processes import wait_until


class Refusal:
    def __init__(self, code: grpc.StatusCode, trailers: tuple[tuple[str, bytes], ...] = ()) -> None:
        self._code, self._trailers = code, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return self._trailers


def retry_info(seconds: int) -> tuple[tuple[str, bytes], ...]:
    info = RetryInfo(retry_delay=Duration(seconds=seconds)).SerializeToString()
    return (("google.rpc.retryinfo-bin", info),)


def test_only_transient_codes_are_retried_and_the_backoff_is_bounded() -> None:
    unavailable = Refusal(grpc.StatusCode.UNAVAILABLE)
    waits = [retry_delay(unavailable, attempt) for attempt in range(8)]
    assert 0.2 <= (waits[0] or 0) <= 0.3 and 0.4 <= (waits[1] or 0) <= 0.6
    assert all(w is not None and w <= MAX_BACKOFF_S * 1.2 for w in waits)
    assert retry_delay(Refusal(grpc.StatusCode.UNAUTHENTICATED), 0) is None
    assert retry_delay(Refusal(grpc.StatusCode.INVALID_ARGUMENT), 0) is None
    # RESOURCE_EXHAUSTED only when the collector says when (OTLP/gRPC's rule); its delay is capped.
    assert retry_delay(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED), 0) is None
    assert retry_delay(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, retry_info(2)), 0) == 2.0
    assert retry_delay(Refusal(grpc.StatusCode.UNAVAILABLE, retry_info(600)), 0) == MAX_BACKOFF_S
    garbage = (("google.rpc.retryinfo-bin", b"\xff\xff"),)
    assert retry_delay(Refusal(grpc.StatusCode.UNAVAILABLE, garbage), 0) is not None


class Outcomes:
    def __init__(self) -> None:
        self.spans: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, outcome: str, spans: int) -> None:
        with self.lock:
            self.spans[outcome] += spans


def one_request() -> bytes:
    encoder = SpanEncoder("test", sampling_ratio=1.0)
    return encoder.request(encoder.spans([("svc/Infer", "", "", 1, 1, 2, {}, None, [], [])]))


def test_a_request_is_tried_at_most_attempts_times() -> None:
    with otlp_receiver("--unavailable", "1000") as receiver:
        outcomes = Outcomes()
        sender = CollectorSender(CollectorTarget(receiver.address, False), outcomes)
        started = time.monotonic()
        sender.send(one_request(), 1)
        wait_until(lambda: outcomes.spans["export_failed"] == 1, 30, what="the request given up")
        elapsed = time.monotonic() - started
        sender.close(1.0)
        assert receiver.refused("UNAVAILABLE") == ATTEMPTS
    assert outcomes.spans == Counter({"export_failed": 1})
    assert 0.25 * 0.8 * (2 ** (ATTEMPTS - 1) - 1) <= elapsed < 15  # 0.25 + 0.5 + 1 + 2 s of backoff, +-20 %


def test_the_queue_is_bounded_and_closing_keeps_its_deadline() -> None:
    with otlp_receiver("--unavailable", "1000") as receiver:
        outcomes = Outcomes()
        sender = CollectorSender(CollectorTarget(receiver.address, False), outcomes)
        sent = QUEUED + 10
        for _ in range(sent):
            sender.send(one_request(), 1)
        assert outcomes.spans["queue_full"] >= sent - QUEUED - 1  # dropped at once, one may be in flight
        started = time.monotonic()
        sender.close(0.5)
        assert time.monotonic() - started < 2.0
        wait_until(lambda: sum(outcomes.spans.values()) == sent, 10, what="every request accounted for")
    # Past the deadline no retry waits: what was queued was tried once more, or dropped unsent.
    assert set(outcomes.spans) <= {"queue_full", "export_failed", "shutdown"}
