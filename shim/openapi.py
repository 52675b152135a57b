"""What /openapi.json says of every route, beside what FastAPI infers: a route's request body and answers
(`documented`), and the error answers each family's routes can give, in that family's error shape
(`with_errors`). The shim reads and parses bodies itself (admission first, then orjson and pydantic), so
FastAPI cannot infer either; generated clients (openapi-generator, orval) and API gateways read both.

Which statuses an API route can answer is derived, not listed by hand: every status of the shim's one
gRPC-code table (an upstream error), and the shim's own refusals: a body it will not read (408, 413, 415),
fields that fail validation (422)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from pydantic import BaseModel
from starlette.routing import BaseRoute, Route

from shim.errors import HTTP_STATUS_BY_CODE

REF = "#/components/schemas/{model}"
JSON = "application/json"
SSE = "text/event-stream"

# The shim's own refusals that no gRPC code maps to, and the ones that only a route with a body can give.
_REFUSALS = {
    408: "the body was sent too slowly",
    413: "the body is too large",
    415: "not a media type the route reads",
}
_BODY_ONLY = frozenset(_REFUSALS)
_VALIDATION = 422
_DESCRIPTIONS = {
    400: "invalid request",
    401: "no valid token",
    403: "the token may not do this",
    404: "unknown model (or other named thing)",
    409: "aborted or already exists",
    422: "a field failed validation",
    429: "overloaded or over quota: retry after Retry-After",
    500: "internal error",
    501: "not implemented by the server",
    503: "unavailable: retry after Retry-After",
    504: "deadline exceeded",
    **_REFUSALS,
}
# A client that left (499) is never answered; OK is the route's own answer.
ERROR_STATUSES: tuple[int, ...] = tuple(
    sorted(
        ({status for status in HTTP_STATUS_BY_CODE.values() if 400 <= status != 499} | set(_REFUSALS))
        | {_VALIDATION}
    )
)


#: The shim's own error shape (shim.errors.ShimError.to_json), the native family's and the probes'.
SHIM_ERROR = "SluiceError"
_TEXT = {"type": "string"}
SHIM_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": _TEXT,
                "message": _TEXT,
                "reason": {"type": ["string", "null"]},
                "domain": {"type": ["string", "null"]},
                "metadata": {"type": "object", "additionalProperties": _TEXT},
                "field_violations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["field", "description"],
                        "properties": {"field": _TEXT, "description": _TEXT, "proto_field": _TEXT},
                    },
                },
                "retry_after_s": {"type": ["number", "null"]},
            },
        }
    },
}


#: One server-sent event, as OpenAPI before 3.2 reads a `text/event-stream` schema (each event, not the
#: stream) and schemathesis checks it: its fields, the data a line of JSON (or `[DONE]`).
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": _TEXT, "event": _TEXT, "id": _TEXT, "retry": {"type": "integer"}},
}


def ref(model: str) -> dict[str, str]:
    return {"$ref": REF.format(model=model)}


def documented(
    request: type[BaseModel] | Mapping[str, Any] | None,
    answer: Mapping[str, Any] | str | None,
    *,
    streams: bool = False,
    media: Iterable[str] = (),
    also: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Route keyword arguments: the request body's schema (a model, or a JSON schema; none if None), the
    answer (a component's name or a schema) as JSON, as server-sent events when the route streams when
    asked, and in any other `media`; `also`: other statuses the route answers in a shape of its own (a
    probe's 503), by JSON schema."""
    extra: dict[str, Any] = {}
    if request is not None:
        body = ref(request.__name__) if isinstance(request, type) else dict(request)
        extra["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    schema = ref(answer) if isinstance(answer, str) else dict(answer or {})
    content: dict[str, Any] = {JSON: {"schema": schema}}
    if streams:
        content[SSE] = {"schema": SSE_EVENT_SCHEMA}
    for other in media:
        content[other] = {"schema": {"type": "string", "format": "binary"}}
    responses: dict[str, Any] = {"200": {"description": "the answer", "content": content}}
    for status, shape in (also or {}).items():
        responses[str(status)] = {
            "description": _DESCRIPTIONS[status],
            "content": {JSON: {"schema": dict(shape)}},
        }
    return {"openapi_extra": extra, "responses": responses}


def components_of(*modules: ModuleType) -> dict[str, Any]:
    """Every pydantic model defined in `modules`, by name, with the models they refer to."""
    out: dict[str, Any] = {}
    for module in modules:
        for model in vars(module).values():
            if (
                isinstance(model, type)
                and issubclass(model, BaseModel)
                and model.__module__ == module.__name__
            ):
                schema = model.model_json_schema(ref_template=REF)
                out.update(schema.pop("$defs", {}))
                out[model.__name__] = schema
    return out


def with_errors(
    document: dict[str, Any], routes: Iterable[BaseRoute], error_schema: Mapping[str, Any]
) -> None:
    """Adds to each operation of `routes` every error status it can answer, with `error_schema` as the JSON
    body (the family's shape); a status the route declares in a shape of its own (a probe's 503) takes
    either. FastAPI's default 422 body is replaced: the shim renders validation errors in the family's
    shape too. 408, 413, 415 and 422 are documented only where a body (or a validated parameter) can
    cause them."""
    for route in routes:
        if not isinstance(route, Route):
            continue
        path = document.get("paths", {}).get(route.path_format)
        if path is None:
            continue
        for method in route.methods or ():
            operation = path.get(method.lower())
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            # Admission reads the body of every POST; a body, or a parameter FastAPI validates (it declared
            # 422), can fail validation.
            has_body = method == "POST"
            validates = has_body or str(_VALIDATION) in responses
            for status in ERROR_STATUSES:
                if (status in _BODY_ONLY and not has_body) or (status == _VALIDATION and not validates):
                    continue
                declared = responses.get(str(status))
                if declared is None or status == _VALIDATION:
                    content = {JSON: {"schema": dict(error_schema)}}
                    responses[str(status)] = {"description": _DESCRIPTIONS[status], "content": content}
                else:  # the route's own shape for this status (a probe's 503), or an error
                    own = declared["content"][JSON]
                    own["schema"] = {"anyOf": [own["schema"], dict(error_schema)]}
