"""Every HTTP error the shim answers: one gRPC-code -> HTTP-status table, one body shape, and the one
place that bounds what an error echoes back.

    ShimError(Exception)            carries an ErrorBody and the HTTP status it is sent with
    ├── upstream_errors()           a context manager: an upstream grpc.aio.AioRpcError inside it is
    │   └── from_rpc_error()        re-raised as a ShimError, details decoded by clients.errors
    ├── from_stream_error()         the ErrorStatus carried by a final GenerateResponse
    └── shim.refusals               the shim's own refusals (malformed, too large, too slow, overloaded)

Every error body has the shape `{"error": {code, message, reason, domain, metadata, field_violations,
retry_after_s}}`, and a RetryInfo adds a `Retry-After` header in whole seconds. An ErrorBody clips every
text it holds to MAX_ECHO_CHARS (with a marker naming the original length) and lists at most MAX_LISTED
metadata entries and field violations, so an error never costs more than a small, fixed amount whatever
the request held; the texts are made UTF-8-encodable as well (a lone surrogate is escaped).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from clients.errors import status_code_from_number, status_details_of
from wire import errors as reasons
from wire.errors import clip as wire_clip

SHIM_DOMAIN = reasons.SHIM_DOMAIN
# What one echoed text may hold, and how many metadata entries and field violations one error lists.
MAX_ECHO_CHARS = 512
MAX_LISTED = 32
# A transport failure carries no RetryInfo; the channel retries the connection this often, at least.
DEFAULT_RECONNECT_S = 1.0

# The one table: canonical gRPC code -> HTTP status. REQUEST_TOO_LARGE refines RESOURCE_EXHAUSTED to 413.
HTTP_STATUS_BY_CODE: Mapping[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_REASON_STATUS_OVERRIDES: Mapping[tuple[grpc.StatusCode, str], int] = {
    (grpc.StatusCode.RESOURCE_EXHAUSTED, reasons.REQUEST_TOO_LARGE): 413,
}


def http_status_for(code: grpc.StatusCode, reason: str | None = None) -> int:
    """The HTTP status for a canonical code, refined by the ErrorInfo reason where the table says so."""
    if reason is not None and (code, reason) in _REASON_STATUS_OVERRIDES:
        return _REASON_STATUS_OVERRIDES[(code, reason)]
    return HTTP_STATUS_BY_CODE.get(code, 500)


def clip(text: str) -> str:
    """`text` as an error may echo it: the wire contract's clip rule at MAX_ECHO_CHARS (the original length
    marked when cut; encodable as UTF-8, a lone surrogate from a JSON escape such as "\\udc80" escaped)."""
    return wire_clip(text, MAX_ECHO_CHARS)


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field: `field` is the name the HTTP caller used, `proto_field` the server's path."""

    field: str
    description: str
    proto_field: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"field": self.field, "description": self.description}
        if self.proto_field is not None:
            body["proto_field"] = self.proto_field
        return body

    def clipped(self) -> FieldViolation:
        proto_field = None if self.proto_field is None else clip(self.proto_field)
        return FieldViolation(clip(self.field), clip(self.description), proto_field)


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """The JSON error object shared by HTTP error responses and SSE terminal events; every text in it is
    clipped on construction, so nothing built from request input can make it large."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None
    domain: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: tuple[FieldViolation, ...] = ()
    retry_after_s: float | None = None

    def __post_init__(self) -> None:
        # A frozen dataclass sets its own fields in __post_init__ through object.__setattr__.
        setattr_ = object.__setattr__
        setattr_(self, "message", clip(self.message))
        setattr_(self, "reason", None if self.reason is None else clip(self.reason))
        setattr_(self, "domain", None if self.domain is None else clip(self.domain))
        entries = list(self.metadata.items())
        metadata = {clip(key): clip(value) for key, value in entries[:MAX_LISTED]}
        if len(entries) > MAX_LISTED:
            metadata["…"] = f"{len(entries) - MAX_LISTED} more entries not shown"
        setattr_(self, "metadata", metadata)
        violations = [violation.clipped() for violation in self.field_violations[:MAX_LISTED]]
        if len(self.field_violations) > MAX_LISTED:
            hidden = len(self.field_violations) - MAX_LISTED
            violations.append(FieldViolation("…", f"{hidden} more field violations not shown"))
        setattr_(self, "field_violations", tuple(violations))

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code.name,
            "message": self.message,
            "reason": self.reason,
            "domain": self.domain,
            "metadata": dict(self.metadata),
            "field_violations": [violation.to_json() for violation in self.field_violations],
            "retry_after_s": self.retry_after_s,
        }


class ShimError(Exception):
    """An error answered to the HTTP caller with `status` and the `{"error": ...}` body."""

    def __init__(self, body: ErrorBody, *, status: int | None = None, close_connection: bool = False) -> None:
        super().__init__(body.message)
        self.body = body
        self.status = status if status is not None else http_status_for(body.code, body.reason)
        # Set where the request's body was left unread on purpose: waiting for it would serve the sender.
        self.close_connection = close_connection

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Connection": "close"} if self.close_connection else {}
        if self.body.retry_after_s is not None:
            # Retry-After takes whole seconds; rounding down could invite a retry that is refused again.
            headers["Retry-After"] = str(max(1, math.ceil(self.body.retry_after_s)))
        return headers

    def to_json(self) -> dict[str, Any]:
        return {"error": self.body.to_json()}


def from_rpc_error(
    exc: grpc.aio.AioRpcError,
    *,
    json_field: Callable[[str], str] = str,
    reconnect_s: float = DEFAULT_RECONNECT_S,
) -> ShimError:
    """Maps a failed upstream call to the HTTP error the caller sees; `json_field` renames proto paths.

    UNAVAILABLE without an ErrorInfo did not come from the server's code but from the transport (no
    connection, connection lost): it is named UPSTREAM_UNAVAILABLE, says gRPC's reason, and asks for a
    retry after the channel's reconnect interval.
    """
    details = status_details_of(exc)
    message = exc.details() or ""
    if exc.code() is grpc.StatusCode.UNAVAILABLE and details.reason is None:
        return ShimError(
            ErrorBody(
                code=grpc.StatusCode.UNAVAILABLE,
                message=f"the upstream server is unavailable: {message or 'no reason given'}",
                reason=reasons.UPSTREAM_UNAVAILABLE,
                domain=SHIM_DOMAIN,
                retry_after_s=details.retry_after if details.retry_after is not None else reconnect_s,
            )
        )
    body = ErrorBody(
        code=exc.code(),
        message=message,
        reason=details.reason,
        domain=details.domain,
        metadata=details.metadata,
        field_violations=tuple(
            FieldViolation(json_field(path), description, proto_field=path)
            for path, description in details.field_violations
        ),
        retry_after_s=details.retry_after,
    )
    return ShimError(body)


@contextmanager
def upstream_errors(
    *, json_field: Callable[[str], str] = str, reconnect_s: float = DEFAULT_RECONNECT_S
) -> Iterator[None]:
    """Re-raises a failed upstream call inside the block as the ShimError its caller is answered with."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc, json_field=json_field, reconnect_s=reconnect_s) from exc


def from_stream_error(code_number: int, message: str, reason: str) -> ErrorBody:
    """The error body for the ErrorStatus a GenerateResponse carries when a generation ended badly."""
    return ErrorBody(code=status_code_from_number(code_number), message=message, reason=reason or None)


def upstream_protocol_error(message: str) -> ShimError:
    """The upstream broke the contract, e.g. ended a generation without a final message."""
    body = ErrorBody(
        code=grpc.StatusCode.INTERNAL,
        message=message,
        reason=reasons.UPSTREAM_PROTOCOL_ERROR,
        domain=SHIM_DOMAIN,
    )
    return ShimError(body)
