"""The Open Inference Protocol's REST API (KServe v2) as an API family: /v2 health, model metadata and
config, infer (JSON tensors and the binary tensor extension), and the generate extension (JSON or SSE).
routes (argument wiring) -> translate (JSON and binary <-> the v2 protobuf) -> the server's own
`inference.GRPCInferenceService` over the shared channel; generation streams its ModelStreamInfer answers.
Errors are the protocol's `{"error": "..."}`, with the status the shim's table gives the gRPC code."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.datastructures import Headers

from shim.errors import ShimError
from shim.families import families_of
from shim.jsonio import JsonResponse
from shim.kserve import routes
from shim.refusals import unsupported_media_type

#: Bodies this family reads: JSON, the binary extension (JSON then tensors, as application/octet-stream),
#: or no Content-Type at all, as tritonclient.http sends; never a form or text/plain, which a web page
#: could post across origins without a preflight.
_MEDIA = frozenset(("application/json", "application/octet-stream"))


#: The protocol's error body, as /openapi.json documents it for every error status.
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}


def error_shape(error: ShimError) -> JsonResponse:
    return JsonResponse({"error": error.body.message}, status_code=error.status, headers=error.headers)


def media_check(headers: Headers) -> None:
    content_type = headers.get("content-type")
    if content_type is not None and content_type.split(";", 1)[0].strip().lower() not in _MEDIA:
        raise unsupported_media_type(content_type)


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app, routes.router, error_shape=error_shape, error_schema=ERROR_SCHEMA, media_check=media_check
    )
