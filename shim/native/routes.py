"""The native family's routes: /v1/infer, /v1/generate (JSON or SSE) and /v1/sluice/models, each a thin
parse -> translate -> call -> translate path over the shared upstream channel; a generation goes through
the shim's generation serving (shim.stream.serving), rendered by shim.native.generation.

The admission middleware has already read each body (bounded in size and time); routes parse it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from fastapi import APIRouter, Request
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import Response

from shim.admission.request_body import parse_body
from shim.errors import upstream_errors
from shim.families import FamilyRoute
from shim.jsonio import JsonResponse
from shim.metrics import Timer, metrics_of
from shim.native import generation, translate
from shim.native.request_models import GenerateBody, InferBody
from shim.openapi import documented
from shim.stream.serving import serve_generation
from shim.upstream.call_options import call_options
from shim.upstream.channel import settings_of, upstream_of
from shim.upstream.disconnect import ClientDisconnected, client_left, unless_disconnected

router = APIRouter(prefix="/v1", route_class=FamilyRoute)


def _upstream_errors(
    request: Request, json_field: Callable[[str], str] = str
) -> AbstractContextManager[None]:
    return upstream_errors(json_field=json_field, reconnect_s=settings_of(request).reconnect_backoff_s)


@router.post("/infer", **documented(InferBody, None))
async def infer(request: Request) -> Response:
    settings = settings_of(request)
    body = parse_body(await request.body(), InferBody)
    options = call_options(body.priority, request.headers, default_timeout_s=settings.infer_timeout_s)
    message = translate.infer_request_to_proto(body, priority=options.priority)
    call = upstream_of(request).inference.Infer(message, timeout=options.timeout_s)
    try:
        with _upstream_errors(request, translate.json_field_for), Timer(metrics_of(request), "/v1/infer"):
            response = await unless_disconnected(request, call)
    except ClientDisconnected:
        call.cancel()
        return client_left(request)
    return JsonResponse(translate.infer_response_to_json(response))


@router.post("/generate", **documented(GenerateBody, None, streams=True))
async def generate(request: Request) -> Response:
    body = parse_body(await request.body(), GenerateBody)
    return await serve_generation(
        request,
        lambda priority: [translate.generate_request_to_proto(body, priority=priority)],
        stream=body.stream,
        answer=lambda choices: JsonResponse(generation.answer(choices[0], model=body.model)),
        events=lambda calls, heartbeat_s: generation.events(calls, heartbeat_s=heartbeat_s, model=body.model),
        priority=body.priority,
        json_field=translate.json_field_for,
    )


@router.get("/sluice/models")
async def list_models(request: Request) -> JsonResponse:
    with _upstream_errors(request):
        response = await upstream_of(request).inference.ListModels(
            pb.ListModelsRequest(), timeout=settings_of(request).infer_timeout_s
        )
    models: list[dict[str, Any]] = [translate.model_info_to_json(info) for info in response.models]
    return JsonResponse({"models": models})


@router.get("/sluice/models/{name}")
async def get_model(request: Request, name: str) -> JsonResponse:
    with _upstream_errors(request):
        response = await upstream_of(request).inference.GetModel(
            pb.GetModelRequest(name=name), timeout=settings_of(request).infer_timeout_s
        )
    return JsonResponse(translate.model_info_to_json(response.model))
