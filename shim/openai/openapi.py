"""What /openapi.json says of the OpenAI routes. Their bodies are read and parsed by the shim itself
(admission first, then orjson and pydantic), so FastAPI cannot infer the schemas: each route declares its
request and answer schemas here, and `with_openai_schemas` adds the models they name to the components."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
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


def _schemas() -> dict[str, Any]:
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


def with_openai_schemas(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """An `app.openapi` that builds FastAPI's document once, with the OpenAI models among its schemas."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(_schemas())
            app.openapi_schema = document
        return app.openapi_schema

    return openapi
