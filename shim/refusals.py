"""The shim's own refusals, each an error in the shared shape (shim.errors) under the shim's domain:
input it cannot read, bodies too large or too slow, a wrong media type, its own bound reached."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from shim.errors import SHIM_DOMAIN, ErrorBody, FieldViolation, ShimError
from wire import errors as reasons


def _shim_error(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str,
    status: int | None = None,
    metadata: Mapping[str, str] | None = None,
    violations: tuple[FieldViolation, ...] = (),
    retry_after_s: float | None = None,
    close_connection: bool = False,
) -> ShimError:
    body = ErrorBody(
        code=code,
        message=message,
        reason=reason,
        domain=SHIM_DOMAIN,
        metadata=metadata or {},
        field_violations=violations,
        retry_after_s=retry_after_s,
    )
    return ShimError(body, status=status, close_connection=close_connection)


def invalid_argument(
    message: str,
    *,
    reason: str,
    violations: tuple[FieldViolation, ...] = (),
    status: int = 400,
) -> ShimError:
    """The shim's own refusal of a request it could not read or translate."""
    return _shim_error(
        grpc.StatusCode.INVALID_ARGUMENT, message, reason=reason, violations=violations, status=status
    )


def request_too_large(limit: int) -> ShimError:
    """A body over max_body_bytes, refused before (or while) reading it."""
    return _shim_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"request body exceeds {limit} bytes",
        reason=reasons.REQUEST_TOO_LARGE,
        metadata={"limit_bytes": str(limit)},
    )


def request_timeout(what: str, timeout_s: float) -> ShimError:
    """A request whose headers or body did not arrive in time; its connection is closed after the answer."""
    return _shim_error(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        f"the request {what} did not arrive within {timeout_s:g} s",
        reason=reasons.REQUEST_TIMEOUT,
        status=408,
        metadata={"timeout_s": f"{timeout_s:g}"},
        close_connection=True,
    )


def unsupported_media_type(content_type: str | None) -> ShimError:
    """A JSON route called with a body that does not say it is JSON (e.g. a cross-site text/plain form)."""
    sent = "no Content-Type" if content_type is None else f"Content-Type {content_type!r}"
    return _shim_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the request body must be JSON (Content-Type: application/json), got {sent}",
        reason=reasons.UNSUPPORTED_MEDIA_TYPE,
        status=415,
        violations=(FieldViolation("Content-Type", "must be application/json or a +json type"),),
    )


def malformed_http(detail: str) -> ShimError:
    """Bytes that are not an HTTP/1.1 request; answered by the connection itself, which then closes."""
    return _shim_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"invalid HTTP request: {detail}",
        reason=reasons.MALFORMED_HTTP,
        close_connection=True,
    )


def shim_overloaded(limit: int) -> ShimError:
    """The shim's own in-flight bound is reached; the caller should retry shortly."""
    return _shim_error(
        grpc.StatusCode.UNAVAILABLE,
        f"the shim is serving its limit of {limit} requests; retry shortly",
        reason=reasons.SHIM_OVERLOADED,
        metadata={"max_inflight": str(limit)},
        retry_after_s=1.0,
    )


def internal_error(exc: BaseException) -> ShimError:
    """The last resort for a failure nothing else mapped: still the error shape, never plain text."""
    return _shim_error(
        grpc.StatusCode.INTERNAL,
        f"the shim failed to handle the request ({type(exc).__name__})",
        reason="SHIM_INTERNAL_ERROR",
    )


def unauthenticated(message: str) -> ShimError:
    """A request without a token the keys file knows; decided on its headers, before its body is read."""
    return _shim_error(grpc.StatusCode.UNAUTHENTICATED, message, reason="UNAUTHENTICATED")
