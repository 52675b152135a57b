"""create_app(): the FastAPI application, its middleware order (CORS, when configured, outside
admission), its error handlers (every error, even an unforeseen one, in the error shape of the API family
that serves the request), the lifespan that owns the one upstream channel, and the families it serves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from auth.keys import load_keys
from process.access_log import AccessLog
from process.tracing import start_tracing
from shim import anthropic, health, lora, native, openai, openai_responses, tokenize
from shim import kserve as kserve_v2
from shim.admission.bound import InflightBound
from shim.admission.middleware import AdmissionMiddleware
from shim.admission.request_body import validation_error
from shim.config import ShimSettings
from shim.cors import BrowserPolicy
from shim.errors import SHIM_DOMAIN, ErrorBody, ShimError
from shim.families import Families, Family, families_of
from shim.metrics import CountingMiddleware, ShimMetrics
from shim.refusals import internal_error
from shim.tracing import TracingMiddleware
from shim.upstream.channel import open_upstream
from shim.upstream.routing import check_routing

# Every API family, in the order their routes match: a new family is a folder and an entry here.
FAMILIES: tuple[Family, ...] = (
    health, native, openai, openai_responses, kserve_v2, anthropic, tokenize, lora,
)  # fmt: skip

# Starlette's own HTTP errors (unknown route, wrong method) in the canonical vocabulary.
_CODE_BY_HTTP_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


async def _on_shim_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ShimError):  # pragma: no cover - registered for ShimError only
        raise exc
    return families_of(request).render(request.scope, exc)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, RequestValidationError):  # pragma: no cover - registered for this type only
        raise exc
    # FastAPI prefixes locations with where the value came from: body, path, query, header.
    return families_of(request).render(request.scope, validation_error(exc.errors(), skip_prefix=1))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for this type only
        raise exc
    code = _CODE_BY_HTTP_STATUS.get(exc.status_code, grpc.StatusCode.UNKNOWN)
    reason = str(exc.detail).upper().replace(" ", "_")
    body = ErrorBody(code=code, message=str(exc.detail), reason=reason, domain=SHIM_DOMAIN)
    return families_of(request).render(request.scope, ShimError(body, status=exc.status_code))


async def _on_unexpected_error(request: Request, exc: Exception) -> Response:
    # Starlette's server-error middleware calls this for anything unhandled, then re-raises it so that
    # uvicorn logs the traceback; the caller gets the error shape instead of a plain-text 500.
    return families_of(request).render(request.scope, internal_error(exc))


def create_app(settings: ShimSettings) -> FastAPI:
    """The shim's ASGI app; the upstream channel opens in the lifespan, inside the serving event loop."""
    check_routing(settings)  # a routing that cannot serve the target fails start-up, not the first call
    tracing = start_tracing(
        settings.otlp_endpoint, sampling_ratio=settings.otlp_sampling_ratio, service="sluice-shim"
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upstream = open_upstream(settings, trace_context=tracing.enabled, routed=app.state.metrics.routed)
        app.state.upstream = upstream
        try:
            yield
        finally:
            await upstream.close()
            tracing.shutdown(wait_s=2.0)

    app = FastAPI(
        title="Sluice shim",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    families = app.state.families = Families()
    app.openapi = lambda: families.openapi(app)  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.inflight = InflightBound(settings.max_inflight)
    app.state.metrics = ShimMetrics()
    app.add_middleware(
        AdmissionMiddleware,
        bound=app.state.inflight,
        families=families,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        keys=load_keys(Path(settings.auth_keys)) if settings.auth_keys else None,
        access_log=AccessLog(settings.access_log),
    )
    # Outside admission, so that its refusals are counted too.
    app.add_middleware(CountingMiddleware, metrics=app.state.metrics)
    if tracing.enabled:  # outside admission and counting: a refused request has its span too
        app.add_middleware(TracingMiddleware, tracing=tracing, families=families)
    if settings.cors_allow_origins:
        # Added last, so outermost: a preflight is answered before admission, and refusals carry CORS headers.
        app.add_middleware(BrowserPolicy, origins=settings.cors_allow_origins, headers=families.cors)
    app.add_exception_handler(ShimError, _on_shim_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
    for family in FAMILIES:
        family.attach(app)
    return app
