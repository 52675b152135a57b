"""AccessLog and the per-call record: sampling, and the line a call writes however it ended."""

from __future__ import annotations

import io
import json
import logging

import pytest
from sluice.inference.v1 import inference_pb2 as pb

from process.access_log import AccessLog
from server.admission import handlers
from server.errors import Overloaded


@pytest.fixture(autouse=True)
def fresh_logger() -> None:
    logging.getLogger("sluice.access").handlers.clear()


class CallContext:
    """What _CallLog reads of a grpc.aio context: the call's metadata."""

    def __init__(self, *metadata: tuple[str, str]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_sampling_follows_the_rate() -> None:
    draws = iter([0.05, 0.5, 0.09])
    log = AccessLog(0.1, stream=io.StringIO(), draw=lambda: next(draws))
    assert [log.sampled() for _ in range(3)] == [True, False, True]
    assert not AccessLog(0.0).sampled() and AccessLog(1.0, stream=io.StringIO()).sampled()


def test_a_stream_that_ended_in_band_with_an_error_logs_that_error() -> None:
    stream = io.StringIO()
    log = AccessLog(1.0, stream=stream)
    request = pb.GenerateRequest(model="byte-lm", request_id="r1")
    last = pb.GenerateResponse(finish_reason=pb.FINISH_REASON_CANCELLED)
    last.usage.completion_tokens = 7
    last.error.code, last.error.reason = 1, "STALLED_CONSUMER"
    with handlers._CallLog(log, "Generate", request, CallContext()) as call:
        call.answer = last
    (line,) = lines(stream)
    assert (line["status"], line["reason"], line["tokens"], line["request_id"]) == (
        "CANCELLED",
        "STALLED_CONSUMER",
        7,
        "r1",
    )


def test_an_aborted_call_logs_the_error_it_was_aborted_with() -> None:
    stream = io.StringIO()
    log = AccessLog(1.0, stream=stream)
    handlers.CALL_ERROR.set(Overloaded("full"))
    with (
        pytest.raises(RuntimeError),
        handlers._CallLog(log, "Infer", pb.InferRequest(model="mlp"), CallContext()),
    ):
        raise RuntimeError("aborted")
    (line,) = lines(stream)
    assert (line["status"], line["reason"], line["model"]) == ("RESOURCE_EXHAUSTED", "QUEUE_FULL", "mlp")


def test_the_end_user_a_gateway_names_is_logged_clipped() -> None:
    stream = io.StringIO()
    log = AccessLog(1.0, stream=stream)
    for user in ("alice", "b" * 500):
        context = CallContext(("x-request-id", "r"), (handlers.USER_KEY, user))
        with handlers._CallLog(log, "Infer", pb.InferRequest(model="mlp"), context):
            pass
    with handlers._CallLog(log, "Infer", pb.InferRequest(model="mlp"), CallContext()):
        pass
    first, second, third = lines(stream)
    assert first["user"] == "alice"
    assert str(second["user"]).startswith("b" * handlers.USER_LOG_LIMIT) and "(500 chars)" in str(
        second["user"]
    )
    assert "user" not in third
