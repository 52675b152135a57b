"""BrowserPolicy: the CORS answer for browsers calling the API from another origin (`--cors-allow-origins`).

A preflight may ask for the headers the shim's own callers send (`content-type`, `x-request-id`, Sluice's
call options) and those each API family declares (`Families.attach(cors=..., token_headers=...)`): its
credential headers and its SDK's own, such as the OpenAI JS SDK's `x-stainless-*` and `openai-*`, whose
members change between SDK releases (so they are allowed by prefix). A response exposes what those clients
read: the request id, the tenant and the retry hints. Anything else is refused as Starlette refuses it (400
"Disallowed CORS headers"). One policy serves every family: a preflight names no family, and a path two
families share cannot say whose request will follow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from shim.identity import REQUEST_ID_HEADER, TENANT_HEADER
from shim.upstream.call_options import PRIORITY_HEADER, TIMEOUT_HEADER

_REQUESTED = "access-control-request-headers"


@dataclass(frozen=True, slots=True)
class CorsHeaders:
    """Headers a browser's page may send (exactly `allow`, or any that begins with one of `allow_prefixes`)
    and may read on the answer (`expose`); all lowercase."""

    allow: tuple[str, ...] = ()
    allow_prefixes: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()

    @staticmethod
    def union(parts: Iterable[CorsHeaders]) -> CorsHeaders:
        allow: dict[str, None] = {}
        prefixes: dict[str, None] = {}
        expose: dict[str, None] = {}
        for part in parts:
            allow.update(dict.fromkeys(name.lower() for name in part.allow))
            prefixes.update(dict.fromkeys(prefix.lower() for prefix in part.allow_prefixes))
            expose.update(dict.fromkeys(name.lower() for name in part.expose))
        return CorsHeaders(tuple(allow), tuple(prefixes), tuple(expose))


#: What every family's callers may send and read, whatever the family.
SHIM_HEADERS = CorsHeaders(
    allow=("content-type", REQUEST_ID_HEADER, PRIORITY_HEADER, TIMEOUT_HEADER),
    expose=(REQUEST_ID_HEADER, TENANT_HEADER, "retry-after"),
)


class BrowserPolicy(CORSMiddleware):
    """`headers()` is what the families declare, asked once the app is built (Starlette builds its
    middleware on the first request, after every family attached itself)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        origins: tuple[str, ...],
        headers: Callable[[], CorsHeaders] | None = None,
    ) -> None:
        self.declared = CorsHeaders.union((SHIM_HEADERS, *(() if headers is None else (headers(),))))
        super().__init__(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=list(self.declared.allow),
            expose_headers=list(self.declared.expose),
        )

    def allowed(self, header: str) -> bool:
        name = header.strip().lower()
        return name in self.declared.allow or name.startswith(self.declared.allow_prefixes)

    def preflight_response(self, request_headers: Headers) -> Response:
        """Starlette matches requested headers exactly; the SDK families are matched by prefix here, and
        a preflight whose every header is allowed gets exactly those back (as a `*` policy would)."""
        requested = request_headers.get(_REQUESTED)
        if requested is None or not all(self.allowed(h) for h in requested.split(",") if h.strip()):
            return super().preflight_response(request_headers)
        rest = Headers(raw=[(k, v) for k, v in request_headers.raw if k.lower() != _REQUESTED.encode()])
        response = super().preflight_response(rest)
        if response.status_code == 200:
            response.headers["access-control-allow-headers"] = requested
        return response
