"""The native JSON API: /v1/infer, /v1/generate (JSON or SSE) and /v1/models, each a thin
parse -> translate -> call -> translate path over the shared upstream channel."""

from __future__ import annotations

from typing import Any

import grpc
from fastapi import APIRouter, Request
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import JSONResponse, Response

from shim import generation, translate
from shim.call_options import call_options
from shim.channel import settings_of, upstream_of
from shim.disconnect import CLIENT_CLOSED_REQUEST, ClientDisconnected, unless_disconnected
from shim.errors import from_rpc_error
from shim.request_body import parse_body
from shim.schemas import GenerateBody, InferBody
from shim.sse import EventStreamResponse

router = APIRouter(prefix="/v1")


@router.post("/infer")
async def infer(request: Request) -> Response:
    settings = settings_of(request)
    body = await parse_body(request, InferBody, limit=settings.max_body_bytes)
    options = call_options(body.priority, request.headers, default_timeout_s=settings.infer_timeout_s)
    message = translate.infer_request_to_proto(body, priority=options.priority)
    call = upstream_of(request).inference.Infer(message, timeout=options.timeout_s)
    try:
        response = await unless_disconnected(request, call)
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc, json_field=translate.json_field_for) from exc
    except ClientDisconnected:
        call.cancel()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(translate.infer_response_to_json(response))


@router.post("/generate")
async def generate(request: Request) -> Response:
    settings = settings_of(request)
    body = await parse_body(request, GenerateBody, limit=settings.max_body_bytes)
    options = call_options(body.priority, request.headers, default_timeout_s=settings.generate_timeout_s)
    message = translate.generate_request_to_proto(body, priority=options.priority)
    call = upstream_of(request).inference.Generate(message, timeout=options.timeout_s)
    handed_off = False
    try:
        first = await unless_disconnected(request, generation.first_message(call))
        if not body.stream:
            return JSONResponse(await unless_disconnected(request, generation.collect(call, first)))
        events = generation.relay_events(call, first, heartbeat_s=settings.sse_heartbeat_s)
        handed_off = True
        return EventStreamResponse(events, on_close=call.cancel)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        # Until the stream response owns the call, any exit (error, JSON answer, disconnect) ends it here.
        if not handed_off:
            call.cancel()


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    try:
        response = await upstream_of(request).inference.ListModels(
            pb.ListModelsRequest(), timeout=settings_of(request).infer_timeout_s
        )
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from exc
    models: list[dict[str, Any]] = [translate.model_info_to_json(info) for info in response.models]
    return JSONResponse({"models": models})


@router.get("/models/{name}")
async def get_model(request: Request, name: str) -> JSONResponse:
    try:
        response = await upstream_of(request).inference.GetModel(
            pb.GetModelRequest(name=name), timeout=settings_of(request).infer_timeout_s
        )
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from exc
    return JSONResponse(translate.model_info_to_json(response.model))
