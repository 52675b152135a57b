"""The API families (shim/native, shim/openai, ...) as shared code sees them: a registry that each family's
`attach(app)` joins with its router and the edges it declares: its error shape, the headers that carry its
callers' tokens, what browsers may send it, a path it shares, and the schemas it adds to /openapi.json.

Shared code asks the registry, never a path of its own:

    in_api(path)        is the request the API's (admitted to the in-flight bound, identified, logged)?
                        Yes under any family's router prefix, or at a path of a family whose routes sit
                        at the root (vLLM's /tokenize); the probes and /openapi.json are no family's.
    error_shape(scope)  in whose shape is an error answered? The family of the route that serves the
                        request, or, before routing, the route that will (matched as Starlette's router
                        matches: the first full match, else the first route that differs by method only);
                        a request no family's route matches gets the shim's own shape (shim_shape).
    token_headers(scope)
                        which headers carry the caller's token (shim.admission.auth), the same way.
    cors()              what browsers may send and read, over every family (shim.cors).

Two families may serve one path and method (Anthropic's `GET /v1/models` beside OpenAI's): the later one
declares the request header that selects it (`selected_by`, such as `anthropic-version`); a request that
carries it goes to that family's route, any other to the earlier family's. Both routes must be FamilyRoutes
(a family's router is `APIRouter(..., route_class=FamilyRoute)`), which match only the requests of their own
family; /openapi.json documents the unselected route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from shim.admission.auth import DEFAULT_TOKEN_HEADERS, TokenHeader
from shim.cors import CorsHeaders
from shim.errors import ShimError
from shim.jsonio import JsonResponse
from shim.openapi import SHIM_ERROR, SHIM_ERROR_SCHEMA, ref, with_errors

#: How a family answers an error: the status and headers the ShimError says, in the family's body shape.
ErrorShape = Callable[[ShimError], Response]
#: Which request bodies a family reads: raises the ShimError (415) for a media type it does not take.
MediaCheck = Callable[[Headers], None]


def shim_shape(error: ShimError) -> JsonResponse:
    """The shim's own shape, `{"error": {code, message, reason, ...}}`, with Retry-After where one is due."""
    return JsonResponse(error.to_json(), status_code=error.status, headers=error.headers)


class FamilyRoute(APIRoute):
    """A family's route that can share its path with another family's: it matches a request only when the
    app's registry admits the request's headers for it (the rules Families.attach set, kept per app: a
    router's routes are module-level objects that every app created in one process includes)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            families = getattr(getattr(scope.get("app"), "state", None), "families", None)
            if isinstance(families, Families) and not families.admits(self, scope["headers"]):
                return Match.NONE, {}
        return match, child_scope


def _shares(route: BaseRoute, other: BaseRoute) -> bool:
    """Whether two routes answer one path for one method at least."""
    if not isinstance(route, APIRoute) or not isinstance(other, APIRoute):
        return False
    return route.path == other.path and bool((route.methods or set()) & (other.methods or set()))


class Family(Protocol):
    """An API family as shim.app sees it: a module (a folder's __init__) that attaches itself."""

    def attach(self, app: FastAPI) -> None: ...


@dataclass(frozen=True, slots=True)
class _Member:
    router: APIRouter
    error_shape: ErrorShape
    schemas: Callable[[], dict[str, Any]] | None
    error_schema: dict[str, Any]
    media_check: MediaCheck | None
    token_headers: tuple[TokenHeader, ...]
    cors: CorsHeaders


@dataclass(slots=True)
class Families:
    """The families attached to one app, in the order their routes match."""

    _members: list[_Member] = field(default_factory=list)
    # id(route) -> (the headers a request must carry, those it must not) to be that route's.
    _rules: dict[int, tuple[frozenset[bytes], frozenset[bytes]]] = field(default_factory=dict)
    api_roots: tuple[str, ...] = ()
    api_paths: frozenset[str] = frozenset()

    def attach(
        self,
        app: FastAPI,
        router: APIRouter,
        *,
        error_shape: ErrorShape,
        schemas: Callable[[], dict[str, Any]] | None = None,
        error_schema: dict[str, Any] | None = None,
        media_check: MediaCheck | None = None,
        token_headers: Sequence[TokenHeader] = DEFAULT_TOKEN_HEADERS,
        cors: CorsHeaders | None = None,
        selected_by: str | None = None,
        at_root: bool = False,
    ) -> None:
        """Includes `router` in `app` as a family's: its routes answer errors in `error_shape`, and
        `schemas()` (component schemas by name) joins /openapi.json, where every error status its routes
        can answer is documented with `error_schema` (default: the shim's own shape); `media_check`
        replaces the JSON-only check of its POST bodies (the v2 family takes the binary tensor extension).
        Its callers show their token in one of `token_headers` (the first present is read); browsers may
        send and read what `cors` names, and its token headers; a path it shares with a family attached
        before it is its own for the requests that carry the header `selected_by`. A family `at_root` has no
        prefix: each of its routes' fixed paths is the API's (vLLM's /tokenize and /detokenize)."""
        if at_root:
            paths = [getattr(route, "path", "") for route in router.routes]
            if router.prefix or not paths or any(not p.startswith("/") or "{" in p for p in paths):
                raise ValueError("a family at the root has no prefix and routes at fixed paths only")
        elif not router.prefix.strip("/"):
            raise ValueError("an API family's router needs a prefix (such as /v1): its paths are the API")
        if not token_headers:
            raise ValueError("an API family accepts its callers' token in one header at least")
        if selected_by is not None:
            self._select(router, selected_by.lower().encode("latin-1"))
        app.include_router(router)
        schema = ref(SHIM_ERROR) if error_schema is None else error_schema
        declared = (tuple(token_headers), cors or CorsHeaders())
        member = _Member(router, error_shape, schemas, schema, media_check, *declared)
        self._members.append(member)
        if at_root:
            self.api_paths |= frozenset(getattr(route, "path", "") for route in router.routes)
            return
        root = router.prefix.rstrip("/") + "/"
        if root not in self.api_roots:
            self.api_roots = (*self.api_roots, root)

    def _select(self, router: APIRouter, header: bytes) -> None:
        """Splits each path `router` shares with an attached family by `header`: the request that carries
        it is the new family's, any other the earlier family's."""
        for route in router.routes:
            for member in self._members:
                for earlier in member.router.routes:
                    if not _shares(route, earlier):
                        continue
                    if not isinstance(route, FamilyRoute) or not isinstance(earlier, FamilyRoute):
                        raise ValueError(
                            f"{getattr(route, 'path', route)} is served by two families: both routers need "
                            "route_class=shim.families.FamilyRoute to share it"
                        )
                    self._add_rule(route, requires=header)
                    route.include_in_schema = False  # OpenAPI has one operation per path and method
                    self._add_rule(earlier, refuses=header)

    def _add_rule(
        self, route: BaseRoute, *, requires: bytes | None = None, refuses: bytes | None = None
    ) -> None:
        needed, refused = self._rules.get(id(route), (frozenset(), frozenset()))
        self._rules[id(route)] = (
            needed | ({requires} if requires else set()),
            refused | ({refuses} if refuses else set()),
        )

    def admits(self, route: BaseRoute, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """Whether a request with `headers` may be `route`'s (its family's, where the path is shared)."""
        rules = self._rules.get(id(route))
        if rules is None:
            return True
        names = {name for name, _ in headers}
        return names.issuperset(rules[0]) and names.isdisjoint(rules[1])

    def in_api(self, path: str) -> bool:
        return path.startswith(self.api_roots) or path in self.api_paths

    def error_shape(self, scope: Scope) -> ErrorShape:
        """The shape of the family whose route serves (or, before routing, will serve) the request."""
        member = self._member(scope)
        return shim_shape if member is None else member.error_shape

    def media_check(self, scope: Scope) -> MediaCheck | None:
        """The body check of the family that will serve the request; None: the shim's JSON-only one."""
        member = self._member(scope)
        return None if member is None else member.media_check

    def token_headers(self, scope: Scope) -> tuple[TokenHeader, ...]:
        """The token headers of the family that will serve the request; for a request no family's route
        matches, every family's (a token the shim knows is not refused for the header it came in)."""
        declared = [member.token_headers for member in self._members]
        if len(set(declared)) == 1:  # the common case: one declaration, no routes to match
            return declared[0]
        member = self._member(scope)
        if member is not None:
            return member.token_headers
        return tuple(dict.fromkeys(h for headers in declared for h in headers)) or DEFAULT_TOKEN_HEADERS

    def cors(self) -> CorsHeaders:
        """What a browser's page may send and read, over every family: their declarations and the headers
        that carry their callers' tokens."""
        tokens = CorsHeaders(allow=tuple(h.key for m in self._members for h in m.token_headers))
        return CorsHeaders.union((tokens, *(member.cors for member in self._members)))

    def _member(self, scope: Scope) -> _Member | None:
        routed = scope.get("route")
        partial: _Member | None = None
        for member in self._members:
            for route in member.router.routes:
                if routed is not None:
                    if route is routed:
                        return member
                    continue
                match, _ = route.matches(scope)
                if match is Match.FULL:
                    return member
                if match is Match.PARTIAL and partial is None:
                    partial = member
        return partial

    def render(self, scope: Scope, error: ShimError) -> Response:
        return self.error_shape(scope)(error)

    def openapi(self, app: FastAPI) -> dict[str, Any]:
        """An `app.openapi`: FastAPI's document, built once, with every family's schemas in its components."""
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = document.setdefault("components", {}).setdefault("schemas", {})
            components[SHIM_ERROR] = SHIM_ERROR_SCHEMA
            for member in self._members:
                if member.schemas is not None:
                    components.update(member.schemas())
                with_errors(document, member.router.routes, member.error_schema)
            app.openapi_schema = document
        return app.openapi_schema


def families_of(connection: HTTPConnection | FastAPI) -> Families:
    """The registry create_app() keeps on the app."""
    app = connection if isinstance(connection, FastAPI) else connection.app
    families: Families = app.state.families
    return families
