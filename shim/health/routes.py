"""The probes: /healthz says the shim process is alive; /readyz says whether it can take work now
(a free in-flight slot of its own, and an upstream whose grpc.health.v1 service ("") reports SERVING);
/metrics is the shim's Prometheus endpoint."""

from __future__ import annotations

from typing import Any

import grpc
from fastapi import APIRouter, Request
from grpc_health.v1 import health_pb2
from starlette.responses import PlainTextResponse, Response

from shim.admission.bound import InflightBound
from shim.jsonio import JsonResponse
from shim.metrics import metrics_of
from shim.openapi import documented
from shim.upstream.channel import settings_of, upstream_of

router = APIRouter()

_STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
_PROMETHEUS: dict[int | str, dict[str, Any]] = {
    "200": {
        "description": "Prometheus' text format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get("/healthz", **documented(None, _STATUS))
async def healthz() -> JsonResponse:
    return JsonResponse({"status": "ok"})


@router.get("/metrics", response_class=PlainTextResponse, responses=_PROMETHEUS)
async def metrics(request: Request) -> Response:
    """Prometheus: requests by route and status, open streams, disconnects, upstream latency."""
    return metrics_of(request).render()


def _unready(reason: str, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"status": "unready", "reason": reason, "message": message, **extra}, status_code=503)


@router.get("/readyz", **documented(None, _STATUS, also={503: _STATUS}))
async def readyz(request: Request) -> JsonResponse:
    """200 when a request sent now would be admitted and served; 503 with the reason otherwise."""
    bound: InflightBound = request.app.state.inflight
    slots = {"inflight": bound.inflight, "max_inflight": bound.limit}
    if bound.full:
        return _unready(
            "SHIM_OVERLOADED", f"every one of the shim's {bound.limit} in-flight slots is held", **slots
        )
    try:
        response = await upstream_of(request).health.Check(
            health_pb2.HealthCheckRequest(service=""), timeout=settings_of(request).ready_timeout_s
        )
    except grpc.aio.AioRpcError as exc:
        return _unready(
            "UPSTREAM_UNAVAILABLE",
            f"the upstream health check failed: {exc.details() or exc.code().name}",
            upstream=exc.code().name,
            **slots,
        )
    upstream = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        return _unready(
            "UPSTREAM_NOT_SERVING", f"the upstream reports {upstream}", upstream=upstream, **slots
        )
    return JsonResponse({"status": "ready", "upstream": upstream, **slots})
