"""status.py: each domain error becomes its canonical code with google.rpc details (AIP-193): ErrorInfo
always, RetryInfo and the pushback trailer for overload, BadRequest for bad input; nothing grows unbounded."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from server.codec.status import DOMAIN, to_grpc_status
from server.errors import (
    InvalidArgument,
    ModelNotFound,
    Overloaded,
    ShuttingDown,
    SluiceError,
    StalledConsumer,
    WrongMethod,
)


def details(status: grpc.Status) -> dict[str, object]:
    metadata = dict(status.trailing_metadata)
    rich = status_pb2.Status.FromString(metadata["grpc-status-details-bin"])  # type: ignore[arg-type]
    out: dict[str, object] = {"pushback": metadata.get("grpc-retry-pushback-ms"), "message": rich.message}
    for detail in rich.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo, error_details_pb2.BadRequest):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                out[kind.__name__] = message
    return out


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (ModelNotFound("nope", ["mlp"]), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        (WrongMethod("byte-lm", "Infer", "Generate"), grpc.StatusCode.FAILED_PRECONDITION, "WRONG_METHOD"),
        (StalledConsumer("stalled"), grpc.StatusCode.CANCELLED, "STALLED_CONSUMER"),
        (SluiceError("boom"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    ],
)
def test_every_error_carries_its_code_and_error_info(
    error: SluiceError, code: grpc.StatusCode, reason: str
) -> None:
    status = to_grpc_status(error)
    assert status.code == code and status.details == error.message
    info = details(status)["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert (info.reason, info.domain) == (reason, DOMAIN)
    assert "RetryInfo" not in details(status) and details(status)["pushback"] is None


@pytest.mark.parametrize(
    "error", [Overloaded("full", retry_after_s=0.25), ShuttingDown("bye", retry_after_s=1.0)]
)
def test_overload_adds_retry_info_and_the_pushback_trailer(error: SluiceError) -> None:
    found = details(to_grpc_status(error))
    retry = found["RetryInfo"]
    assert isinstance(retry, error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToNanoseconds() == int((error.retry_after_s or 0) * 1e9)
    assert found["pushback"] == str(round((error.retry_after_s or 0) * 1000))


def test_bad_input_adds_field_violations() -> None:
    error = InvalidArgument("two problems", field="inputs[0].shape", violations=[("a", "x"), ("b", "y")])
    bad = details(to_grpc_status(error))["BadRequest"]
    assert isinstance(bad, error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad.field_violations] == [("a", "x"), ("b", "y")]


def test_nothing_a_caller_sent_makes_the_status_large() -> None:
    name = "m" * 100_000
    status = to_grpc_status(ModelNotFound(name, ["mlp"]))
    size = sum(len(k) + len(v) for k, v in status.trailing_metadata)
    assert size < 2048 and len(status.details) < 300
    assert "(100000 chars)" in status.details
    many = InvalidArgument("x" * 50_000, field="f" * 5000, violations=[("f", "d" * 5000)] * 1000)
    status = to_grpc_status(many)
    assert sum(len(k) + len(v) for k, v in status.trailing_metadata) < 40_000
