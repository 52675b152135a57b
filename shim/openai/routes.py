"""The OpenAI family's routes: argument wiring only (parse -> serving module -> response). Bodies are read by
the admission middleware; errors, theirs and the middleware's, are answered in the family's shape
(shim/openai_errors.py), which the family registry (shim.families) hands the app's handlers."""

from __future__ import annotations

import re
import string
import time
from types import ModuleType
from typing import Any, TypeVar
from urllib.parse import quote

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import Response

from shim.admission.request_body import parse_json, validation_error
from shim.errors import FieldViolation, ShimError, upstream_errors
from shim.families import FamilyRoute
from shim.identity import current_request_id
from shim.jsonio import JsonResponse
from shim.metrics import Timer, metrics_of
from shim.openai import chat, completions, embeddings
from shim.openai.request_models import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Unsupported
from shim.openai.structured import ParamError
from shim.openapi import documented
from shim.refusals import invalid_argument
from shim.request_metrics import request_metrics
from shim.stream.consumer import Choice
from shim.stream.serving import serve_generation
from shim.upstream.call_options import CallOptions, call_options
from shim.upstream.channel import settings_of, upstream_of
from shim.upstream.disconnect import ClientDisconnected, client_left, unless_disconnected
from wire.metadata import USER

router = APIRouter(prefix="/v1", tags=["openai"], route_class=FamilyRoute)
BodyT = TypeVar("BodyT", bound=BaseModel)
USER_METADATA = USER
USER_FORWARD_LIMIT = 256
_PRINTABLE = string.punctuation.replace("%", "") + " "
STARTED = int(time.time())  # `created` of every model: when this process began serving it

# Server-side proto paths -> the OpenAI parameter a caller set.
_PARAM_BY_PROTO = {
    "text": "prompt",
    "token_ids.ids": "prompt",
    "chat.messages": "messages",
    "sampling.logprobs": "logprobs",
}
_INDEXED = re.compile(r"\[\d+\].*$")


def openai_param(proto_path: str) -> str:
    if proto_path.startswith("constraint"):
        return "response_format"
    path = _INDEXED.sub("", proto_path)
    return _PARAM_BY_PROTO.get(path, path.removeprefix("sampling."))


def parse(raw: bytes, schema: type[BodyT]) -> BodyT:
    """The body as `schema`; every refusal is a 400 naming the parameter, as OpenAI's API answers."""
    document = parse_json(raw)
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        for error in errors:
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, ParamError):
                violation = FieldViolation(cause.param, str(cause))
                raise invalid_argument(
                    str(cause), reason="CONFLICTING_PARAMETERS", violations=(violation,)
                ) from None
            if isinstance(cause, Unsupported):
                violation = FieldViolation(cause.param, str(cause))
                raise invalid_argument(
                    str(cause), reason="UNSUPPORTED_PARAMETER", violations=(violation,)
                ) from None
            if error["type"] == "extra_forbidden":
                name = ".".join(map(str, error["loc"]))
                message = f"unrecognized request argument supplied: {name}"
                violation = FieldViolation(name, message)
                raise invalid_argument(message, reason="UNKNOWN_PARAMETER", violations=(violation,)) from None
        refused = validation_error(errors, document=document)
        raise ShimError(refused.body, status=400) from None


def _metadata(body: Any) -> tuple[tuple[str, str], ...]:
    """OpenAI's `user`, for the server's access log: gRPC metadata carries printable ASCII only, so any
    other character is percent-encoded; the server clips what it logs."""
    user = getattr(body, "user", None)
    return ((USER_METADATA, quote(user[:USER_FORWARD_LIMIT], safe=_PRINTABLE)),) if user else ()


def _options(request: Request, default_timeout_s: float) -> CallOptions:
    return call_options(None, request.headers, default_timeout_s=default_timeout_s)


async def _create(
    request: Request, kind: type[ChatCompletionRequest | CompletionRequest], dialect: ModuleType
) -> Response:
    """A chat completion or a completion: `dialect` (shim.openai.chat or .completions) builds the Generate
    calls and shapes their answer; the shim's generation serving (shim.stream.serving) runs them."""
    body = parse(await request.body(), kind)
    request_id: str = dialect.new_id()

    def answer(choices: list[Choice]) -> Response:
        failed = next((c.error for c in choices if c.error is not None), None)
        if failed is not None:  # a choice that ended with an error fails the whole request
            raise ShimError(failed)
        answered = dialect.completion(body, choices, request_id=request_id)
        # vLLM's per-request `metrics` beside the usage (docs: README, "Per-request timings").
        answered["metrics"] = request_metrics(
            answered["usage"], [c.timings for c in choices], model=body.model
        )
        return JsonResponse(answered)

    return await serve_generation(
        request,
        lambda priority: dialect.generate_requests(body, request_id=request_id, priority=priority),
        stream=body.stream,
        answer=answer,
        events=lambda calls, heartbeat_s: dialect.chunks(
            body, calls, request_id=request_id, heartbeat_s=heartbeat_s
        ),
        metadata=_metadata(body),
        json_field=openai_param,
        timed_as=request.url.path,
    )


@router.post("/chat/completions", **documented(ChatCompletionRequest, "ChatCompletion", streams=True))
async def create_chat_completion(request: Request) -> Response:
    return await _create(request, ChatCompletionRequest, chat)


@router.post("/completions", **documented(CompletionRequest, "Completion", streams=True))
async def create_completion(request: Request) -> Response:
    return await _create(request, CompletionRequest, completions)


@router.post("/embeddings", **documented(EmbeddingRequest, "EmbeddingList"))
async def create_embeddings(request: Request) -> Response:
    settings = settings_of(request)
    body = parse(await request.body(), EmbeddingRequest)
    options = _options(request, settings.infer_timeout_s)
    requests = embeddings.infer_requests(
        body, priority=options.priority, request_id=f"emb-{current_request_id() or int(time.time() * 1e6)}"
    )
    with (
        upstream_errors(json_field=openai_param, reconnect_s=settings.reconnect_backoff_s),
        Timer(metrics_of(request), "/v1/embeddings"),
    ):
        try:
            responses = await unless_disconnected(
                request,
                embeddings.embed(
                    upstream_of(request), requests, timeout_s=options.timeout_s, metadata=_metadata(body)
                ),
            )
        except ClientDisconnected:
            return client_left(request)
    return JsonResponse(embeddings.embedding_list(body, responses))


def _model(info: pb.ModelInfo) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "model",
        "created": STARTED,
        "owned_by": "sluice",
        "quantization": info.quantization or "none",
        "parent": info.parent or None,  # a LoRA adapter's base model, as vLLM lists it
    }


@router.get("/models", **documented(None, "ModelList"))
async def list_models(request: Request) -> JsonResponse:
    settings = settings_of(request)
    with upstream_errors(reconnect_s=settings.reconnect_backoff_s):
        response = await upstream_of(request).inference.ListModels(
            pb.ListModelsRequest(), timeout=settings.infer_timeout_s
        )
    return JsonResponse({"object": "list", "data": [_model(info) for info in response.models]})


@router.get("/models/{model_id:path}", **documented(None, "Model"))
async def retrieve_model(request: Request, model_id: str) -> JsonResponse:
    settings = settings_of(request)
    with upstream_errors(reconnect_s=settings.reconnect_backoff_s):
        response = await upstream_of(request).inference.GetModel(
            pb.GetModelRequest(name=model_id), timeout=settings.infer_timeout_s
        )
    return JsonResponse(_model(response.model))
