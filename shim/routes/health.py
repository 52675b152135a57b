"""Probes: /healthz says the shim process is alive; /readyz asks the upstream's grpc.health.v1 service."""

from __future__ import annotations

import grpc
from fastapi import APIRouter, Request
from grpc_health.v1 import health_pb2
from starlette.responses import JSONResponse

from shim.channel import settings_of, upstream_of

router = APIRouter()


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready only when the server reports SERVING for the overall service ("")."""
    try:
        response = await upstream_of(request).health.Check(
            health_pb2.HealthCheckRequest(service=""), timeout=settings_of(request).ready_timeout_s
        )
    except grpc.aio.AioRpcError as exc:
        return JSONResponse({"status": "unready", "upstream": exc.code().name}, status_code=503)
    upstream = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    serving = response.status == health_pb2.HealthCheckResponse.SERVING
    return JSONResponse(
        {"status": "ready" if serving else "unready", "upstream": upstream},
        status_code=200 if serving else 503,
    )
