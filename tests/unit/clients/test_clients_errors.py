"""clients.errors: status code -> exception class, and google.rpc details decoded from real trailers."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc import aio
from grpc_status import rpc_status

from clients.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    RequestCancelledError,
    ResourceExhaustedError,
    SluiceError,
    StatusDetails,
    UnavailableError,
    decode_status_details,
    error_from_rpc,
    typed_errors,
)


def _rpc_error(
    code: grpc.StatusCode,
    message: str,
    *details: object,
    details_message: str | None = None,
    details_code: grpc.StatusCode | None = None,
) -> aio.AioRpcError:
    """A real AioRpcError whose trailers carry `grpc-status-details-bin`, as grpc_status encodes it."""
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    rich = status_pb2.Status(
        code=(details_code or code).value[0], message=details_message or message, details=packed
    )
    trailers = rpc_status.to_status(rich).trailing_metadata if details else ()
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(*trailers), message, None)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
        (grpc.StatusCode.NOT_FOUND, NotFoundError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (grpc.StatusCode.UNAVAILABLE, UnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceededError),
        (grpc.StatusCode.CANCELLED, RequestCancelledError),
        (grpc.StatusCode.INTERNAL, InternalError),
        (grpc.StatusCode.UNIMPLEMENTED, SluiceError),
        (grpc.StatusCode.FAILED_PRECONDITION, SluiceError),
    ],
)
def test_each_code_maps_to_its_class(code: grpc.StatusCode, cls: type[SluiceError]) -> None:
    error = error_from_rpc(_rpc_error(code, "boom"))
    assert type(error) is cls
    assert (error.code, error.message) == (code, "boom")
    assert (error.reason, error.domain, error.metadata, error.retry_after, error.field_violations) == (
        None,
        None,
        {},
        None,
        [],
    )


def test_error_info_and_retry_info_are_decoded() -> None:
    info = error_details_pb2.ErrorInfo(reason="QUEUE_FULL", domain="sluice.dev", metadata={"model": "m"})
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2, nanos=250_000_000))
    error = error_from_rpc(_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", info, retry))
    assert isinstance(error, ResourceExhaustedError)
    assert (error.reason, error.domain, error.metadata) == ("QUEUE_FULL", "sluice.dev", {"model": "m"})
    assert error.retry_after == 2.25
    assert str(error) == "RESOURCE_EXHAUSTED/QUEUE_FULL: full"


def test_bad_request_field_violations_are_decoded() -> None:
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(
                field="sampling.top_p", description="must be in (0, 1]"
            ),
            error_details_pb2.BadRequest.FieldViolation(field="model", description="must not be empty"),
        ]
    )
    error = error_from_rpc(_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "bad", bad))
    assert error.field_violations == [("sampling.top_p", "must be in (0, 1]"), ("model", "must not be empty")]


def test_details_of_another_code_fall_back_to_the_transport_status() -> None:
    info = error_details_pb2.ErrorInfo(reason="STALE")
    error = error_from_rpc(
        _rpc_error(grpc.StatusCode.NOT_FOUND, "gone", info, details_code=grpc.StatusCode.INTERNAL)
    )
    assert isinstance(error, NotFoundError)
    assert (error.message, error.reason) == ("gone", None)


def test_details_survive_a_rewritten_message_but_the_transport_message_wins() -> None:
    info = error_details_pb2.ErrorInfo(reason="QUEUE_FULL")
    error = error_from_rpc(_rpc_error(grpc.StatusCode.NOT_FOUND, "gone", info, details_message="other"))
    assert isinstance(error, NotFoundError)
    assert (error.message, error.reason) == ("gone", "QUEUE_FULL")


def test_unparsable_details_are_ignored() -> None:
    trailers = aio.Metadata(("grpc-status-details-bin", b"\xff\xff not a status"))
    error = error_from_rpc(aio.AioRpcError(grpc.StatusCode.INTERNAL, aio.Metadata(), trailers, "boom", None))
    assert isinstance(error, InternalError)
    assert (error.message, error.reason) == ("boom", None)


def test_typed_errors_chains_the_grpc_error() -> None:
    original = _rpc_error(grpc.StatusCode.UNAVAILABLE, "down")
    with pytest.raises(UnavailableError) as caught, typed_errors():
        raise original
    assert caught.value.__cause__ is original


def test_status_details_decode_to_a_plain_dataclass() -> None:
    packed = []
    for detail in (
        error_details_pb2.ErrorInfo(reason="QUEUE_FULL", domain="sluice.inference.v1", metadata={"q": "g"}),
        error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000)),
        error_details_pb2.BadRequest(
            field_violations=[error_details_pb2.BadRequest.FieldViolation(field="model", description="empty")]
        ),
    ):
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    rich = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], details=packed)
    assert decode_status_details(rich) == StatusDetails(
        reason="QUEUE_FULL",
        domain="sluice.inference.v1",
        metadata={"q": "g"},
        retry_after=1.5,
        field_violations=(("model", "empty"),),
    )
    assert decode_status_details(None) == StatusDetails()
