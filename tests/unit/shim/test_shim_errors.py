"""errors.py: the code -> HTTP table, the decoding of google.rpc rich status details, transport failures,
the clipping of everything an error echoes; refusals.py: the shim's own refusals."""

from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import code_pb2
from shim_fakes import rich_status

from shim.errors import (
    HTTP_STATUS_BY_CODE,
    MAX_ECHO_CHARS,
    MAX_LISTED,
    ErrorBody,
    FieldViolation,
    ShimError,
    clip,
    from_rpc_error,
    from_stream_error,
    http_status_for,
    upstream_errors,
)
from shim.native.translate import json_field_for
from shim.refusals import internal_error, request_timeout, shim_overloaded, unsupported_media_type


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


def test_a_transport_failure_is_upstream_unavailable_with_retry_after() -> None:
    refused = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        "failed to connect to all addresses; last error: Connection refused",
    )
    error = from_rpc_error(refused, reconnect_s=2.5)
    assert error.status == 503
    assert error.headers == {"Retry-After": "3"}
    assert error.body.reason == "UPSTREAM_UNAVAILABLE"
    assert error.body.domain == "shim.sluice"
    assert error.body.message == (
        "the upstream server is unavailable: "
        "failed to connect to all addresses; last error: Connection refused"
    )


def test_an_unavailable_from_the_server_keeps_its_own_reason() -> None:
    status = rich_status(code_pb2.UNAVAILABLE, "warming up", reason="NOT_READY", retry_after_s=4)
    error = from_rpc_error(_rpc_error(status))
    assert (error.body.reason, error.body.domain, error.body.message) == (
        "NOT_READY",
        "sluice.inference.v1",
        "warming up",
    )
    assert error.headers == {"Retry-After": "4"}


def test_upstream_errors_reraises_a_failed_call_as_its_shim_error() -> None:
    status = rich_status(
        code_pb2.INVALID_ARGUMENT, "bad", reason="INVALID_ARGUMENT", violations=(("text", "empty"),)
    )
    original = _rpc_error(status)
    with pytest.raises(ShimError) as caught, upstream_errors(json_field=json_field_for):
        raise original
    assert caught.value.__cause__ is original
    assert caught.value.status == 400
    assert caught.value.body.field_violations[0].field == "prompt"
    with pytest.raises(KeyError), upstream_errors():
        raise KeyError("not a gRPC error: untouched")


def test_every_echoed_text_is_clipped_with_its_length() -> None:
    long = "x" * 100_000
    body = ErrorBody(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"prompt holds {long!r}",
        reason=long,
        domain=long,
        metadata={long: long, **{f"k{i}": "v" for i in range(99)}},
        field_violations=tuple(FieldViolation(long, long, proto_field=long) for _ in range(50)),
    )
    encoded = json.dumps(ShimError(body).to_json())
    assert len(encoded) < 64 * 1024
    error = json.loads(encoded)["error"]
    marker = "… (100000 chars)"  # the wire contract's clip rule, as the server's
    assert error["message"] == f"prompt holds '{'x' * (MAX_ECHO_CHARS - 14)}… (100015 chars)"
    assert error["reason"] == error["domain"] == "x" * MAX_ECHO_CHARS + marker
    assert len(error["metadata"]) == MAX_LISTED + 1
    assert error["metadata"]["…"] == f"{100 - MAX_LISTED} more entries not shown"
    violations = error["field_violations"]
    assert len(violations) == MAX_LISTED + 1
    assert {violations[0]["field"], violations[0]["description"], violations[0]["proto_field"]} == {
        "x" * MAX_ECHO_CHARS + marker
    }
    assert violations[-1] == {
        "field": "…",
        "description": f"{50 - MAX_LISTED} more field violations not shown",
    }


def test_short_texts_are_echoed_unchanged() -> None:
    assert clip("prompt holds 'hé'") == "prompt holds 'hé'"
    assert len(clip("y" * MAX_ECHO_CHARS)) == MAX_ECHO_CHARS


def test_a_lone_surrogate_in_an_echo_is_escaped_so_the_body_encodes() -> None:
    body = ErrorBody(
        grpc.StatusCode.INVALID_ARGUMENT, "bad \udc80", field_violations=(FieldViolation("p.\ud800", "d"),)
    )
    assert body.message == "bad \\udc80"
    assert body.field_violations[0].field == "p.\\ud800"
    json.dumps(body.to_json(), ensure_ascii=False).encode("utf-8")


def test_the_shims_own_refusals_say_what_to_do() -> None:
    slow = request_timeout("body", 30.0)
    assert (slow.status, slow.headers) == (408, {"Connection": "close"})
    media = unsupported_media_type("text/plain")
    assert media.status == 415
    assert "application/json" in media.body.message and "'text/plain'" in media.body.message
    assert unsupported_media_type(None).body.message.endswith("got no Content-Type")
    overloaded = shim_overloaded(4)
    assert (overloaded.status, overloaded.headers) == (503, {"Retry-After": "1"})
    crash = internal_error(ZeroDivisionError())
    assert (crash.status, crash.body.reason) == (500, "SHIM_INTERNAL_ERROR")
