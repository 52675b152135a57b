"""errors.py: the code -> HTTP table and the decoding of google.rpc rich status details."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2
from shim_fakes import rich_status

from shim.errors import HTTP_STATUS_BY_CODE, from_rpc_error, from_stream_error, http_status_for
from shim.translate import json_field_for


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.CANCELLED, 499),
        (grpc.StatusCode.FAILED_PRECONDITION, 400),
        (grpc.StatusCode.UNIMPLEMENTED, 501),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.UNKNOWN, 500),
        (grpc.StatusCode.PERMISSION_DENIED, 403),
        (grpc.StatusCode.UNAUTHENTICATED, 401),
        (grpc.StatusCode.ABORTED, 409),
        (grpc.StatusCode.OUT_OF_RANGE, 400),
    ],
)
def test_table_maps_each_code(code: grpc.StatusCode, status: int) -> None:
    assert http_status_for(code) == status


def test_every_code_has_an_entry() -> None:
    assert set(HTTP_STATUS_BY_CODE) == set(grpc.StatusCode)


def test_request_too_large_refines_resource_exhausted_to_413() -> None:
    assert http_status_for(grpc.StatusCode.RESOURCE_EXHAUSTED, "REQUEST_TOO_LARGE") == 413
    assert http_status_for(grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL") == 429
    assert http_status_for(grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_TOO_LARGE") == 400


def _rpc_error(status: grpc.Status, *, details: str | None = None) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        details=status.details if details is None else details,
    )


def test_decodes_error_info_retry_info_and_bad_request() -> None:
    status = rich_status(
        code_pb2.RESOURCE_EXHAUSTED,
        "queue full",
        reason="QUEUE_FULL",
        retry_after_s=2.2,
        violations=(("sampling.max_tokens", "must be <= 64"),),
        metadata={"queue": "generate"},
    )
    error = from_rpc_error(_rpc_error(status), json_field=json_field_for)
    assert error.status == 429
    assert error.headers == {"Retry-After": "3"}
    assert error.to_json() == {
        "error": {
            "code": "RESOURCE_EXHAUSTED",
            "message": "queue full",
            "reason": "QUEUE_FULL",
            "domain": "sluice.inference.v1",
            "metadata": {"queue": "generate"},
            "field_violations": [
                {"field": "max_tokens", "description": "must be <= 64", "proto_field": "sampling.max_tokens"}
            ],
            "retry_after_s": pytest.approx(2.2),
        }
    }


def test_short_retry_delay_still_asks_for_at_least_one_second() -> None:
    status = rich_status(code_pb2.UNAVAILABLE, "draining", reason="SHUTTING_DOWN", retry_after_s=0.2)
    error = from_rpc_error(_rpc_error(status))
    assert error.status == 503
    assert error.headers == {"Retry-After": "1"}


def test_details_survive_a_message_that_differs_from_the_status_proto() -> None:
    status = rich_status(code_pb2.RESOURCE_EXHAUSTED, "too large", reason="REQUEST_TOO_LARGE")
    error = from_rpc_error(_rpc_error(status, details="rewritten by a proxy"))
    assert error.status == 413
    assert error.body.reason == "REQUEST_TOO_LARGE"
    assert error.body.message == "rewritten by a proxy"


def test_plain_status_without_details() -> None:
    error = from_rpc_error(
        grpc.aio.AioRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "late"
        )
    )
    assert error.status == 504
    assert error.headers == {}
    assert error.to_json()["error"] == {
        "code": "DEADLINE_EXCEEDED",
        "message": "late",
        "reason": None,
        "domain": None,
        "metadata": {},
        "field_violations": [],
        "retry_after_s": None,
    }


def test_stream_error_status_uses_the_code_name() -> None:
    body = from_stream_error(13, "model crashed", "MODEL_ERROR")
    assert body.to_json()["code"] == "INTERNAL"
    assert body.reason == "MODEL_ERROR"
    assert from_stream_error(999, "?", "").to_json()["code"] == "UNKNOWN"
