"""The v2 family's routes, each a thin parse -> translate -> call -> translate path over the shared
upstream channel to the server's `inference.GRPCInferenceService` (the same admission and models as the
server's own v2 clients get)."""

from __future__ import annotations

from typing import Any

import grpc
from fastapi import APIRouter, Request
from sluice.kserve.v2 import grpc_service_pb2 as v2
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc
from starlette.responses import Response

from shim.errors import upstream_errors
from shim.families import FamilyRoute
from shim.jsonio import JsonResponse
from shim.kserve import generation, translate
from shim.kserve.models import config_to_json, metadata_to_json
from shim.openapi import SSE, documented
from shim.upstream.call_options import timeout_from
from shim.upstream.channel import settings_of, upstream_of
from shim.upstream.disconnect import ClientDisconnected, client_left, unless_disconnected
from wire.metadata import FORWARDED_FOR

router = APIRouter(prefix="/v2", route_class=FamilyRoute)

# What /openapi.json says of the routes: bodies are JSON objects (the binary extension appends tensors after
# one); the probes answer 503 in a shape of their own; infer may answer with binary tensors appended.
_OBJECT = {"type": "object"}
_BINARY = "application/octet-stream"
_LIVE, _READY = (
    {"type": "object", "required": [k], "properties": {k: {"type": "boolean"}}} for k in ("live", "ready")
)
_MODEL_READY = {**_READY, "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}


def stub_of(request: Request) -> v2_grpc.GRPCInferenceServiceAsyncStub:
    """One stub on the shared channel, made on first use."""
    state = request.app.state
    stub: Any = getattr(state, "kserve_stub", None)
    channel = upstream_of(request).channel
    if stub is None or stub.channel is not channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        stub.channel = channel
        state.kserve_stub = stub
    return stub  # type: ignore[no-any-return]


def _timeout(request: Request) -> float:
    return timeout_from(settings_of(request).infer_timeout_s, request.headers)


def _origin(request: Request) -> tuple[tuple[str, str], ...]:
    """The HTTP client's address as `x-forwarded-for`, on the calls that may reach shared memory: to the
    server every call through the shim comes from the shim's host, and the server serves shared memory only
    to callers on its own (server/kserve/peers.py). uvicorn's proxy-header handling has already put a
    trusted local proxy's client here."""
    client = request.client
    return ((FORWARDED_FOR, client.host),) if client is not None and client.host else ()


def _errors(request: Request) -> Any:
    return upstream_errors(reconnect_s=settings_of(request).reconnect_backoff_s)


@router.get("")
async def server_metadata(request: Request) -> JsonResponse:
    with _errors(request):
        answer = await stub_of(request).ServerMetadata(v2.ServerMetadataRequest(), timeout=_timeout(request))
    return JsonResponse(
        {"name": answer.name, "version": answer.version, "extensions": list(answer.extensions)}
    )


@router.get("/health/live", **documented(None, _LIVE, also={503: _LIVE}))
async def live(request: Request) -> JsonResponse:
    with _errors(request):
        answer = await stub_of(request).ServerLive(v2.ServerLiveRequest(), timeout=_timeout(request))
    return JsonResponse({"live": answer.live}, status_code=200 if answer.live else 503)


@router.get("/health/ready", **documented(None, _READY, also={503: _READY}))
async def ready(request: Request) -> JsonResponse:
    try:
        answer = await stub_of(request).ServerReady(v2.ServerReadyRequest(), timeout=_timeout(request))
    except grpc.aio.AioRpcError:  # an unreachable server is a shim that is not ready, not an error
        return JsonResponse({"ready": False}, status_code=503)
    return JsonResponse({"ready": answer.ready}, status_code=200 if answer.ready else 503)


@router.get("/models/{name}")
@router.get("/models/{name}/versions/{version}")
async def model_metadata(request: Request, name: str, version: str = "") -> JsonResponse:
    with _errors(request):
        answer = await stub_of(request).ModelMetadata(
            v2.ModelMetadataRequest(name=name, version=version), timeout=_timeout(request)
        )
    return JsonResponse(metadata_to_json(answer))


@router.get("/models/{name}/config")
@router.get("/models/{name}/versions/{version}/config")
async def model_config(request: Request, name: str, version: str = "") -> JsonResponse:
    with _errors(request):
        answer = await stub_of(request).ModelConfig(
            v2.ModelConfigRequest(name=name, version=version), timeout=_timeout(request)
        )
    return JsonResponse(config_to_json(answer.config))


@router.get("/models/{name}/ready", **documented(None, _MODEL_READY, also={503: _MODEL_READY}))
@router.get(
    "/models/{name}/versions/{version}/ready", **documented(None, _MODEL_READY, also={503: _MODEL_READY})
)
async def model_ready(request: Request, name: str, version: str = "") -> JsonResponse:
    with _errors(request):
        answer = await stub_of(request).ModelReady(
            v2.ModelReadyRequest(name=name, version=version), timeout=_timeout(request)
        )
        if answer.ready:
            return JsonResponse({"name": name, "ready": True})
        # Every model is loaded at start-up: not ready on a ready server means it is not served at all.
        server = await stub_of(request).ServerReady(v2.ServerReadyRequest(), timeout=_timeout(request))
    if server.ready:
        return JsonResponse({"error": f"model {name[:64]!r} is not served here"}, status_code=404)
    return JsonResponse({"name": name, "ready": False}, status_code=503)


@router.post("/models/{name}/infer", **documented(_OBJECT, _OBJECT, media=[_BINARY]))
@router.post("/models/{name}/versions/{version}/infer", **documented(_OBJECT, _OBJECT, media=[_BINARY]))
async def infer(request: Request, name: str, version: str = "") -> Response:
    document, binary = translate.split_body(
        await request.body(), request.headers.get(translate.HEADER_LENGTH)
    )
    message = translate.infer_request(name, document, binary)
    message.model_version = version
    call = stub_of(request).ModelInfer(message, timeout=_timeout(request), metadata=_origin(request))
    try:
        with _errors(request):
            response = await unless_disconnected(request, call)
    except ClientDisconnected:
        call.cancel()
        return client_left(request)
    named, default = translate.binary_outputs_of(document)
    answer, tail = translate.infer_response(response, named, default)
    if not tail:
        return JsonResponse(answer)
    header = JsonResponse(answer).body
    return Response(
        bytes(header) + tail,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


@router.post("/models/{name}/generate", **documented(_OBJECT, _OBJECT))
@router.post("/models/{name}/versions/{version}/generate", **documented(_OBJECT, _OBJECT))
async def generate(request: Request, name: str, version: str = "") -> Response:
    message = generation.generate_request(name, version, await request.body())
    return await generation.answer(request, stub_of(request), message, timeout_s=_timeout(request))


@router.post("/models/{name}/generate_stream", **documented(_OBJECT, None, media=[SSE]))
@router.post("/models/{name}/versions/{version}/generate_stream", **documented(_OBJECT, None, media=[SSE]))
async def generate_stream(request: Request, name: str, version: str = "") -> Response:
    message = generation.generate_request(name, version, await request.body())
    return generation.events(request, stub_of(request), message, timeout_s=_timeout(request))


# -- the system shared memory extension: regions on the server's host, registered for the caller --------


def _regions(answer: v2.SystemSharedMemoryStatusResponse) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in answer.regions.values()
    ]


@router.get("/systemsharedmemory/status")
@router.get("/systemsharedmemory/region/{name}/status")
async def shared_memory_status(request: Request, name: str = "") -> JsonResponse:
    with _errors(request):
        answer = await stub_of(request).SystemSharedMemoryStatus(
            v2.SystemSharedMemoryStatusRequest(name=name),
            timeout=_timeout(request),
            metadata=_origin(request),
        )
    return JsonResponse(_regions(answer))


@router.post("/systemsharedmemory/region/{name}/register", **documented(_OBJECT, _OBJECT))
async def shared_memory_register(request: Request, name: str) -> JsonResponse:
    document, _ = translate.split_body(await request.body(), None)
    key, offset, size = document.get("key"), document.get("offset", 0), document.get("byte_size")
    if (
        not isinstance(key, str)
        or not isinstance(offset, int)
        or not isinstance(size, int)
        or min(offset, size) < 0
    ):
        raise translate.bad_request('the body must be {"key": string, "offset": int, "byte_size": int}')
    with _errors(request):
        await stub_of(request).SystemSharedMemoryRegister(
            v2.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=size),
            timeout=_timeout(request),
            metadata=_origin(request),
        )
    return JsonResponse({})


@router.post("/systemsharedmemory/unregister")
@router.post("/systemsharedmemory/region/{name}/unregister")
async def shared_memory_unregister(request: Request, name: str = "") -> JsonResponse:
    with _errors(request):
        await stub_of(request).SystemSharedMemoryUnregister(
            v2.SystemSharedMemoryUnregisterRequest(name=name),
            timeout=_timeout(request),
            metadata=_origin(request),
        )
    return JsonResponse({})
