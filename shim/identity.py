"""Who a request is and on whose behalf: its request id (the caller's `X-Request-Id`, else one made here)
and its tenant (from the keys file), known from the headers before the body is read. Both go upstream with
the call (the id as the request's `request_id`, the tenant in the token the server checks again), come
back as response headers, and appear in both processes' access logs."""

from __future__ import annotations

import contextvars
import secrets

from starlette.datastructures import Headers

REQUEST_ID_HEADER = "x-request-id"
TENANT_HEADER = "x-sluice-tenant"
_MAX_ID_CHARS = 128

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


def request_id_from(headers: Headers) -> str:
    """The caller's X-Request-Id where it is printable ASCII of at most 128 characters; else a new one (a
    header that cannot travel as gRPC metadata is replaced, not refused)."""
    given = headers.get(REQUEST_ID_HEADER, "").strip()
    if 0 < len(given) <= _MAX_ID_CHARS and all(" " < ch <= "~" for ch in given):
        return given
    return secrets.token_hex(8)


def current_request_id() -> str | None:
    return REQUEST_ID.get()
