"""BrowserPolicy: the CORS answer for browsers calling the API from another origin (`--cors-allow-origins`).

A preflight may ask for the headers the API's own clients send: credentials (`authorization`, Azure's
`api-key`), `x-request-id`, Sluice's call options, and the OpenAI JS SDK's `x-stainless-*` and `openai-*`
families, whose members change between SDK releases (so they are allowed by prefix). A response exposes
what those clients read: the request id, the tenant and the retry hints. Anything else is refused as
Starlette refuses it (400 "Disallowed CORS headers").
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from shim.identity import REQUEST_ID_HEADER, TENANT_HEADER
from shim.upstream.call_options import PRIORITY_HEADER, TIMEOUT_HEADER
from wire import metadata as names

ALLOWED_HEADERS = (
    "content-type",
    names.AUTHORIZATION,
    names.API_KEY_HEADER,
    REQUEST_ID_HEADER,
    PRIORITY_HEADER,
    TIMEOUT_HEADER,
)
ALLOWED_PREFIXES = ("x-stainless-", "openai-")
EXPOSED_HEADERS = (REQUEST_ID_HEADER, TENANT_HEADER, "retry-after", "retry-after-ms")
_REQUESTED = "access-control-request-headers"


def allowed(header: str) -> bool:
    name = header.strip().lower()
    return name in ALLOWED_HEADERS or name.startswith(ALLOWED_PREFIXES)


class BrowserPolicy(CORSMiddleware):
    def __init__(self, app: ASGIApp, *, origins: tuple[str, ...]) -> None:
        super().__init__(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=list(ALLOWED_HEADERS),
            expose_headers=list(EXPOSED_HEADERS),
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        """Starlette matches requested headers exactly; the SDK families are matched by prefix here, and
        a preflight whose every header is allowed gets exactly those back (as a `*` policy would)."""
        requested = request_headers.get(_REQUESTED)
        if requested is None or not all(allowed(h) for h in requested.split(",") if h.strip()):
            return super().preflight_response(request_headers)
        rest = Headers(raw=[(k, v) for k, v in request_headers.raw if k.lower() != _REQUESTED.encode()])
        response = super().preflight_response(rest)
        if response.status_code == 200:
            response.headers["access-control-allow-headers"] = requested
        return response
