"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`), a family of its own
beside shim/openai (families never import each other; what both need, OpenAI's error shape, is
shim/openai_errors.py): routes (argument wiring) -> request_models (the body; refusals: what cannot be
honoured, named) -> conversation (input items, tools, text.format -> one Generate call) -> answer (the
response object) or events (its server-sent events), run by shim.stream.serving; store keeps responses for
`previous_response_id`, bounded. `attach(app)` is all that shim.app knows of it."""

from __future__ import annotations

from fastapi import FastAPI

from shim import openai_errors
from shim.admission.auth import AZURE_API_KEY, BEARER
from shim.cors import CorsHeaders
from shim.families import families_of
from shim.openai_responses import openapi, routes
from shim.openai_responses.store import ResponseStore

#: What the official SDKs send and read from a browser, as for the other OpenAI family.
CORS = CorsHeaders(allow_prefixes=("x-stainless-", "openai-"), expose=("retry-after-ms",))


def attach(app: FastAPI) -> None:
    app.state.response_store = ResponseStore()
    families_of(app).attach(
        app,
        routes.router,
        error_shape=openai_errors.error_response,
        schemas=openapi.component_schemas,
        error_schema=openapi.ERROR_SCHEMA,
        token_headers=(BEARER, AZURE_API_KEY),
        cors=CORS,
    )
