"""Anthropic's Messages API as an API family: POST /v1/messages (whole or streamed as Anthropic's events),
POST /v1/messages/count_tokens and Anthropic's view of GET /v1/models. routes (argument wiring) ->
request_models (pydantic shapes) -> messages (the conversation <-> the Generate contract) and streaming
(its server-sent events), over the shim's generation serving and one channel; errors (its error shape)
from the shim's one code table. `attach(app)` is all that shim.app knows of it: it declares the family's
edges (error shape, token headers, CORS headers, the header that selects its /v1/models)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from shim.admission.auth import BEARER, TokenHeader
from shim.anthropic import errors, request_models, response_models, routes
from shim.cors import CorsHeaders
from shim.families import families_of
from shim.openapi import components_of

#: The SDKs send the key as `x-api-key` (or, given an auth token, `Authorization: Bearer`).
X_API_KEY = TokenHeader("x-api-key")
#: What the official SDKs send besides the body (`anthropic-version`, `anthropic-beta`, a browser's
#: `anthropic-dangerous-direct-browser-access`, their `x-stainless-*`) and read on an overload.
CORS = CorsHeaders(
    allow_prefixes=("anthropic-", "x-stainless-"), expose=("retry-after", "retry-after-ms", "request-id")
)
#: Every request of Anthropic's SDKs carries it: on a path another family serves too (/v1/models), it
#: selects this family's route.
SELECTOR = "anthropic-version"


def component_schemas() -> dict[str, Any]:
    return components_of(request_models, response_models)


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app,
        routes.router,
        error_shape=errors.error_response,
        schemas=component_schemas,
        error_schema=errors.ERROR_SCHEMA,
        token_headers=(X_API_KEY, BEARER),
        cors=CORS,
        selected_by=SELECTOR,
    )
