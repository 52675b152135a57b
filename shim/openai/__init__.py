"""The OpenAI-compatible API family: routes (argument wiring) -> request_models (pydantic shapes) -> serving
modules (chat, completions, embeddings: translate, call, stream) over the shim's one gRPC channel, rendered by
streaming (its server-sent events) and shim.openai_errors (OpenAI's error shape, shared with the Responses
family); openapi documents the routes and response_models the answers. `attach(app)` is all that shim.app
knows of it: it declares the family's edges (error shape, token headers, CORS headers)."""

from __future__ import annotations

from fastapi import FastAPI

from shim import openai_errors
from shim.admission.auth import AZURE_API_KEY, BEARER
from shim.cors import CorsHeaders
from shim.families import families_of
from shim.openai import openapi, routes

#: What the official SDKs send besides the body: the token (Azure's `api-key` header for Azure), and their
#: own `x-stainless-*` and `openai-*` headers, whose members change between releases; they read the
#: millisecond retry hint of an overload.
CORS = CorsHeaders(allow_prefixes=("x-stainless-", "openai-"), expose=("retry-after-ms",))


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app,
        routes.router,
        error_shape=openai_errors.error_response,
        schemas=openapi.component_schemas,
        error_schema=openapi.ERROR_SCHEMA,
        token_headers=(BEARER, AZURE_API_KEY),
        cors=CORS,
    )
