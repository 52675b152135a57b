"""The OpenAI-compatible API family: routes (argument wiring) -> request_models (pydantic shapes) -> serving
modules (chat, completions, embeddings: translate, call, stream) over the shim's one gRPC channel, rendered by
streaming (its server-sent events) and errors (its error shape, from the shim's one code table); openapi
documents the routes and response_models the answers. `attach(app)` is all that shim.app knows of it."""

from __future__ import annotations

from fastapi import FastAPI

from shim.families import families_of
from shim.openai import errors, openapi, routes


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app,
        routes.router,
        error_shape=errors.error_response,
        schemas=openapi.component_schemas,
        error_schema=openapi.ERROR_SCHEMA,
    )
