"""POST /tokenize and /detokenize, as vLLM serves them: each one Tokenize or Detokenize call to the server
(the model's own tokenizer and chat template, admitted as a generation is), answered as
`{count, max_model_len, tokens}` and `{prompt}`. Bodies are read by the admission middleware; errors are
answered in the family's shape (shim/tokenize/__init__.py)."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from sluice.inference.v1 import inference_pb2 as pb
from starlette.responses import Response

from clients.codec import encode_priority
from shim.admission.request_body import parse_json, validation_error
from shim.errors import FieldViolation, ShimError
from shim.families import FamilyRoute
from shim.identity import current_request_id
from shim.jsonio import JsonResponse
from shim.openapi import documented
from shim.refusals import invalid_argument
from shim.tokenize.request_models import DetokenizeRequest, TokenizeMessage, TokenizeRequest, Unsupported
from shim.upstream.call_options import CallOptions
from shim.upstream.unary import call_unary

router = APIRouter(tags=["tokenize"], route_class=FamilyRoute)
BodyT = TypeVar("BodyT", bound=BaseModel)

_ROLES = {"developer": "system"}  # OpenAI's newer name for the system prompt
_FIELDS = (
    (re.compile(r"^text$"), "prompt"),
    (re.compile(r"^chat\.messages"), "messages"),
    (re.compile(r"^token_ids"), "tokens"),
)
TOKENIZE_ANSWER = {
    "type": "object",
    "required": ["count", "max_model_len", "tokens"],
    "properties": {
        "count": {"type": "integer"},
        "max_model_len": {"type": "integer"},
        "tokens": {"type": "array", "items": {"type": "integer"}},
    },
}
DETOKENIZE_ANSWER = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}


def json_field(proto_path: str) -> str:
    """The server's proto path as the caller named it (`chat.messages[0].role` -> `messages[0].role`)."""
    for pattern, name in _FIELDS:
        if pattern.match(proto_path):
            return pattern.sub(name, proto_path, count=1)
    return proto_path


def parse(raw: bytes, schema: type[BodyT]) -> BodyT:
    """The body as `schema`; a refusal is a 400 naming the field, as vLLM answers."""
    document = parse_json(raw)
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        for error in errors:
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, Unsupported):
                violation = FieldViolation(cause.param, str(cause))
                raise invalid_argument(
                    str(cause), reason="UNSUPPORTED_PARAMETER", violations=(violation,)
                ) from None
        raise ShimError(validation_error(errors, document=document).body, status=400) from None


def _turn(message: TokenizeMessage) -> pb.ChatMessage:
    return pb.ChatMessage(
        role=_ROLES.get(message.role, message.role),
        content=message.text,
        tool_calls=[
            pb.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in message.tool_calls or ()
        ],
        tool_call_id=message.tool_call_id or "",
        name=message.name or "",
    )


def tokenize_message(body: TokenizeRequest, options: CallOptions) -> pb.TokenizeRequest:
    message = pb.TokenizeRequest(
        model=body.model, priority=encode_priority(options.priority), request_id=current_request_id() or ""
    )
    if body.messages is not None:
        message.chat.messages.extend(_turn(m) for m in body.messages)
        message.add_generation_prompt = body.add_generation_prompt
        message.add_special_tokens = bool(body.add_special_tokens)
        message.tools.extend(t.to_tool().to_proto() for t in body.tools or ())
    else:
        message.text = body.prompt or ""
        message.add_special_tokens = body.add_special_tokens is not False
    return message


@router.post("/tokenize", **documented(TokenizeRequest, TOKENIZE_ANSWER))
async def tokenize(request: Request) -> Response:
    body = parse(await request.body(), TokenizeRequest)

    def start(stub: Any, options: CallOptions) -> Any:
        return stub.Tokenize(tokenize_message(body, options), timeout=options.timeout_s)

    answer = await call_unary(request, start, json_field=json_field, timed_as="/tokenize")
    if isinstance(answer, Response):
        return answer
    tokens = list(answer.token_ids)
    return JsonResponse({"count": len(tokens), "max_model_len": answer.context_length, "tokens": tokens})


@router.post("/detokenize", **documented(DetokenizeRequest, DETOKENIZE_ANSWER))
async def detokenize(request: Request) -> Response:
    body = parse(await request.body(), DetokenizeRequest)

    def start(stub: Any, options: CallOptions) -> Any:
        message = pb.DetokenizeRequest(
            model=body.model,
            token_ids=body.tokens,
            priority=encode_priority(options.priority),
            request_id=current_request_id() or "",
        )
        return stub.Detokenize(message, timeout=options.timeout_s)

    answer = await call_unary(request, start, json_field=json_field, timed_as="/detokenize")
    if isinstance(answer, Response):
        return answer
    return JsonResponse({"prompt": answer.text})
