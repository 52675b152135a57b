"""What /openapi.json says of the OpenAI routes. Their bodies are read and parsed by the shim itself
(admission first, then orjson and pydantic), so FastAPI cannot infer the schemas: each route declares its
request and answer schemas here, and `component_schemas` gives the models they name to the components."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from shim.openai import request_models, response_models

_REF = "#/components/schemas/{model}"
_ERROR = {"content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}}}
_ERRORS = {
    str(status): {"description": what, **_ERROR}
    for status, what in (
        (400, "invalid request"),
        (404, "unknown model"),
        (413, "body too large"),
        (415, "not JSON"),
        (429, "overloaded: retry after Retry-After"),
        (503, "unavailable"),
        (504, "deadline exceeded"),
    )
}


def documented(request: type[BaseModel] | None, answer: str, *, streams: bool = False) -> dict[str, Any]:
    """Route keyword arguments: the request body schema (if any), the answer (and, for a route that
    streams when asked, its server-sent events), and the error shape."""
    extra: dict[str, Any] = {}
    if request is not None:
        schema = {"$ref": _REF.format(model=request.__name__)}
        extra["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": _REF.format(model=answer)}}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    ok = {"description": "the answer", "content": content}
    return {"openapi_extra": extra, "responses": {"200": ok, **_ERRORS}}


def component_schemas() -> dict[str, Any]:
    """Every request and answer model of the family, by name, with the models they refer to."""
    out: dict[str, Any] = {}
    for module in (request_models, response_models):
        for model in vars(module).values():
            if (
                isinstance(model, type)
                and issubclass(model, BaseModel)
                and model.__module__ == module.__name__
            ):
                schema = model.model_json_schema(ref_template=_REF)
                out.update(schema.pop("$defs", {}))
                out[model.__name__] = schema
    return out
