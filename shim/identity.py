"""Who a request is and on whose behalf: its request id (the caller's `X-Request-Id`, else one made here),
its tenant (from the keys file) and the token it showed, known from the headers before the body is read.
The admission middleware sets them for the request's task; they go upstream with the call (the id as the
request's `request_id`, the token as `authorization` metadata, which the server checks again), the id and
tenant come back as response headers, and appear in both processes' access logs."""

from __future__ import annotations

import contextvars
import secrets

from starlette.datastructures import Headers

from wire import metadata as names

REQUEST_ID_HEADER = names.REQUEST_ID
TENANT_HEADER = names.TENANT
_MAX_ID_CHARS = 128

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
#: The tenant's prefix-cache salt (auth/keys.py): prefix routing keeps tenants apart as the server does.
CACHE_SALT: contextvars.ContextVar[str | None] = contextvars.ContextVar("cache_salt", default=None)
#: The token of the request being served; the middleware sets it, the upstream interceptors read it.
FORWARDED_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("forwarded_token", default=None)


def request_id_from(headers: Headers) -> str:
    """The caller's X-Request-Id where it is printable ASCII of at most 128 characters; else a new one (a
    header that cannot travel as gRPC metadata is replaced, not refused)."""
    given = headers.get(REQUEST_ID_HEADER, "").strip()
    if 0 < len(given) <= _MAX_ID_CHARS and all(" " < ch <= "~" for ch in given):
        return given
    return secrets.token_hex(8)


def current_request_id() -> str | None:
    return REQUEST_ID.get()
