"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`), a family of its own
beside shim/openai (families never import each other; what both need, OpenAI's error shape, is
shim/openai_errors.py): routes (argument wiring) -> request_models (the body; refusals: what cannot be
honoured, named) -> conversation (input items, tools, text.format -> one Generate call) -> answer (the
response object) or events (its server-sent events), run by shim.stream.serving; store keeps responses for
`previous_response_id`, bounded; response_models document the answers in /openapi.json. `attach(app)` is all
that shim.app knows of it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from shim import openai_errors
from shim.admission.auth import AZURE_API_KEY, BEARER
from shim.cors import CorsHeaders
from shim.families import families_of
from shim.openai_responses import request_models, response_models, routes
from shim.openai_responses.store import ResponseStore
from shim.openapi import components_of

#: What the official SDKs send and read from a browser, as for the other OpenAI family.
CORS = CorsHeaders(allow_prefixes=("x-stainless-", "openai-"), expose=("retry-after-ms",))


def component_schemas() -> dict[str, Any]:
    """What /openapi.json adds for the family: its request and answer models, and OpenAI's error shape."""
    return components_of(request_models, response_models, openai_errors)


def attach(app: FastAPI) -> None:
    app.state.response_store = ResponseStore()
    families_of(app).attach(
        app,
        routes.router,
        error_shape=openai_errors.error_response,
        schemas=component_schemas,
        error_schema=openai_errors.ERROR_SCHEMA,
        token_headers=(BEARER, AZURE_API_KEY),
        cors=CORS,
    )
