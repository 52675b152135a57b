"""vLLM's tokenizer routes as an API family: POST /tokenize (a prompt or chat messages -> the model's token
ids, with the chat template applied to messages) and POST /detokenize (token ids -> text), at the root as
vLLM and SGLang serve them, over the server's Tokenize and Detokenize RPCs. routes (argument wiring, the
translation) -> request_models (pydantic shapes). Errors are vLLM's shape, `{"error": {message, type,
param, code}}`, `code` being the HTTP status. `attach(app)` is all that shim.app knows of it."""

from __future__ import annotations

from fastapi import FastAPI

from shim.errors import ShimError
from shim.families import families_of
from shim.jsonio import JsonResponse
from shim.openapi import components_of
from shim.tokenize import request_models, routes

_TYPE_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "TimeoutError",
    413: "BadRequestError",
    415: "BadRequestError",
    422: "BadRequestError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}
_TEXT = {"type": "string"}
#: The family's error body, for every error status /openapi.json documents.
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": _TEXT,
                "type": _TEXT,
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
        }
    },
}


def error_shape(error: ShimError) -> JsonResponse:
    violations = error.body.field_violations
    kind = _TYPE_BY_STATUS.get(error.status, "InternalServerError")
    message = error.body.message
    if error.body.reason == "VALIDATION_FAILED" and violations:  # what each (of the first three) lacks
        message = "; ".join(f"{v.field}: {v.description}" for v in violations[:3])
    body = {
        "message": message,
        "type": kind,
        "param": violations[0].field if violations else None,
        "code": error.status,
    }
    return JsonResponse({"error": body}, status_code=error.status, headers=error.headers)


def attach(app: FastAPI) -> None:
    families_of(app).attach(
        app,
        routes.router,
        error_shape=error_shape,
        schemas=lambda: components_of(request_models),
        error_schema=ERROR_SCHEMA,
        at_root=True,
    )
