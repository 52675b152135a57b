"""Maps domain errors (server/errors.py) to gRPC statuses with google.rpc details (AIP-193).

Every status carries ErrorInfo; overload and memory errors add RetryInfo plus the
`grpc-retry-pushback-ms` trailer that gRPC's built-in retry honours; bad input adds BadRequest.
"""

from __future__ import annotations

import math

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from server.errors import InvalidArgument, SluiceError, clip
from wire.errors import DOMAIN
from wire.metadata import RETRY_PUSHBACK_MS

__all__ = ["DOMAIN", "to_grpc_status"]
# A backstop under the clipping each error does of the values it echoes: whatever a message says, the
# status (message + details, sent twice: as grpc-message and inside grpc-status-details-bin) stays small.
_MESSAGE_LIMIT = 1024
_FIELD_LIMIT = 128


def to_grpc_status(error: SluiceError) -> grpc.Status:
    """Builds the status (code, message, trailing metadata with details) for one domain error."""
    details: list[any_pb2.Any] = []
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=error.metadata)
    details.append(_pack(info))
    pushback: list[tuple[str, str]] = []
    if error.retry_after_s is not None:
        seconds = max(error.retry_after_s, 0.001)
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(seconds * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        pushback.append((RETRY_PUSHBACK_MS, str(math.ceil(seconds * 1000))))
    if isinstance(error, InvalidArgument):
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=clip(f, _FIELD_LIMIT), description=clip(d, _MESSAGE_LIMIT)
                )
                for f, d in error.violations[:16]
            ]
        )
        details.append(_pack(bad))
    message = clip(error.message, _MESSAGE_LIMIT)
    proto = status_pb2.Status(code=code_pb2.Code.Value(error.code), message=message, details=details)
    status = rpc_status.to_status(proto)
    return _Status(status.code, status.details, tuple(status.trailing_metadata) + tuple(pushback))


def grpc_code(error: SluiceError) -> grpc.StatusCode:
    return grpc.StatusCode[error.code]


def _pack(
    message: error_details_pb2.ErrorInfo | error_details_pb2.RetryInfo | error_details_pb2.BadRequest,
) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


class _Status(grpc.Status):
    def __init__(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[tuple[str, str | bytes], ...]
    ) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata
