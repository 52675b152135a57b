"""The Anthropic family's routes: argument wiring only. POST /v1/messages builds one Generate call
(shim.anthropic.messages) that the shim's generation serving (shim.stream.serving) runs, answered whole or
as Anthropic's events (shim.anthropic.streaming); POST /v1/messages/count_tokens is one Tokenize call over
the same conversation and tools; GET /v1/models in Anthropic's list shape, for the requests that carry
`anthropic-version` (the family's selector; OpenAI's answers the others)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import Response

from clients.codec import encode_priority
from shim.admission.request_body import json_path, parse_json, validation_error
from shim.anthropic import errors, messages, streaming
from shim.anthropic.request_models import TAG, CountTokensRequest, MessagesRequest, Unsupported
from shim.errors import ErrorBody, FieldViolation, ShimError, upstream_errors
from shim.families import FamilyRoute
from shim.identity import current_request_id
from shim.jsonio import JsonResponse
from shim.openapi import documented
from shim.refusals import invalid_argument
from shim.stream.consumer import Choice
from shim.stream.serving import serve_generation
from shim.upstream.call_options import CallOptions
from shim.upstream.channel import settings_of, upstream_of
from shim.upstream.unary import call_unary
from wire import errors as reasons
from wire.metadata import USER

router = APIRouter(prefix="/v1", tags=["anthropic"], route_class=FamilyRoute)
BodyT = TypeVar("BodyT", bound=BaseModel)
STARTED = datetime.fromtimestamp(time.time(), UTC).isoformat().replace("+00:00", "Z")
_PARAMS = {"text": "messages", "chat.messages": "messages", "sampling.stop": "stop_sequences"}


def _documented(request: type[BaseModel] | None, answer: str, *, streams: bool = False) -> dict[str, Any]:
    """shim.openapi.documented, and the 529 Anthropic answers an overload with (beside the shared table's)."""
    declared = documented(request, answer, streams=streams)
    overloaded: dict[str, Any] = {
        "description": "overloaded: retry after retry-after",
        "content": {"application/json": {"schema": errors.ERROR_SCHEMA}},
    }
    declared["responses"][str(errors.OVERLOADED)] = overloaded
    return declared


def anthropic_param(proto_path: str) -> str:
    """A server's proto path as the body named it (`sampling.top_k` -> `top_k`)."""
    for path, name in _PARAMS.items():
        if proto_path == path or proto_path.startswith((f"{path}[", f"{path}.")):
            return name + proto_path[len(path) :]
    return proto_path.removeprefix("sampling.")


def parse(raw: bytes, schema: type[BodyT]) -> BodyT:
    """The body as `schema`; every refusal is a 400 `invalid_request_error` naming the field."""
    document = parse_json(raw)
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        found: list[dict[str, Any]] = [
            {**error, "loc": tuple(p for p in error["loc"] if not str(p).startswith(TAG))}
            for error in exc.errors(include_url=False, include_input=False)
        ]
        for error in found:
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, Unsupported):
                where = json_path(tuple(error["loc"]), document) if error["loc"] else ""
                field = f"{where}.{cause.param}" if where else cause.param
                message = f"{field} is not supported: {str(cause).partition(': ')[2]}"
                raise invalid_argument(
                    message, reason="UNSUPPORTED_PARAMETER", violations=(FieldViolation(field, message),)
                ) from None
        raise ShimError(validation_error(found, document=document).body, status=400) from None


def _metadata(body: MessagesRequest) -> tuple[tuple[str, str], ...]:
    """metadata.user_id, for the server's access log (printable ASCII only, as gRPC metadata carries)."""
    user = body.metadata.user_id if body.metadata is not None else None
    if not user:
        return ()
    return ((USER, "".join(c if " " <= c <= "~" else "?" for c in user[:256])),)


@router.post("/messages", **_documented(MessagesRequest, "AnthropicMessage", streams=True))
async def create_message(request: Request) -> Response:
    body = parse(await request.body(), MessagesRequest)
    message_id = messages.new_id()

    def answer(choices: list[Choice]) -> Response:
        if choices[0].error is not None:  # a generation that ended with an error fails the request
            raise ShimError(choices[0].error)
        return JsonResponse(messages.message_json(body, choices[0], message_id=message_id))

    return await serve_generation(
        request,
        lambda priority: [messages.generate_request(body, request_id=message_id, priority=priority)],
        stream=body.stream,
        answer=answer,
        events=lambda calls, heartbeat_s: streaming.events(
            body, calls, message_id=message_id, heartbeat_s=heartbeat_s
        ),
        metadata=_metadata(body),
        json_field=anthropic_param,
        timed_as="/v1/messages",
    )


@router.post("/messages/count_tokens", **_documented(CountTokensRequest, "AnthropicTokensCount"))
async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as /v1/messages would send it: the chat template over the system prompt, the
    messages and the tools, up to where the assistant speaks."""
    body = parse(await request.body(), CountTokensRequest)
    built = messages.prompt_request(body)

    def start(stub: Any, options: CallOptions) -> Any:
        message = pb.TokenizeRequest(
            model=body.model,
            chat=built.chat,
            tools=built.tools,
            priority=encode_priority(options.priority),
            request_id=current_request_id() or "",
        )
        return stub.Tokenize(message, timeout=options.timeout_s)

    counted = await call_unary(
        request, start, json_field=anthropic_param, timed_as="/v1/messages/count_tokens"
    )
    if isinstance(counted, Response):
        return counted
    return JsonResponse({"input_tokens": len(counted.token_ids)})


def _model(info: pb.ModelInfo) -> dict[str, Any]:
    return {"type": "model", "id": info.name, "display_name": info.name, "created_at": STARTED}


@router.get("/models", **_documented(None, "AnthropicModelsPage"))
async def list_models(request: Request) -> JsonResponse:
    """The generative models (the ones Messages can serve), in one page."""
    settings = settings_of(request)
    with upstream_errors(reconnect_s=settings.reconnect_backoff_s):
        response = await upstream_of(request).inference.ListModels(
            pb.ListModelsRequest(), timeout=settings.infer_timeout_s
        )
    data = [_model(m) for m in response.models if m.kind == pb.MODEL_KIND_GENERATIVE]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return JsonResponse({"data": data, "has_more": False, "first_id": first, "last_id": last})


@router.get("/models/{model_id:path}", **_documented(None, "AnthropicModel"))
async def retrieve_model(request: Request, model_id: str) -> JsonResponse:
    settings = settings_of(request)
    with upstream_errors(reconnect_s=settings.reconnect_backoff_s):
        response = await upstream_of(request).inference.GetModel(
            pb.GetModelRequest(name=model_id), timeout=settings.infer_timeout_s
        )
    if response.model.kind != pb.MODEL_KIND_GENERATIVE:  # as the list says: Messages serves it not
        message = f"model {model_id!r} is a tensor model, which /v1/messages does not serve"
        raise ShimError(ErrorBody(grpc.StatusCode.NOT_FOUND, message, reason=reasons.MODEL_NOT_FOUND))
    return JsonResponse(_model(response.model))
