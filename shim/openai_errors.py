"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, shared by the two OpenAI families
(shim/openai: chat, completions, embeddings, models; shim/openai_responses: the Responses API), which may not
import each other. From the shim's one code table (shim/errors.py): the HTTP status is the same as on the
native routes, and an overload carries `Retry-After` and `retry-after-ms`, which the official SDKs wait for
before they retry."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from shim.errors import ShimError
from shim.jsonio import JsonResponse
from shim.openapi import ref

#: The shape in /openapi.json, for every error status an OpenAI family's routes can answer.
ERROR_SCHEMA = ref("ErrorResponse")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    504: "timeout_error",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def openai_error_json(error: ShimError) -> dict[str, Any]:
    body = error.body
    violations = body.field_violations
    return {
        "error": {
            "message": body.message,
            "type": _TYPE_BY_STATUS.get(error.status, "server_error" if error.status >= 500 else "api_error"),
            "param": violations[0].field if violations else None,
            "code": (body.reason or body.code.name).lower(),
        }
    }


def openai_headers(error: ShimError) -> dict[str, str]:
    """The native headers (Retry-After in whole seconds) plus the SDKs' millisecond hint."""
    headers = error.headers
    if error.body.retry_after_s is not None:
        headers["retry-after-ms"] = str(max(1, round(error.body.retry_after_s * 1000)))
    return headers


def error_response(error: ShimError) -> JsonResponse:
    """The family's error shape (shim.families.ErrorShape), for its routes' errors and refusals alike."""
    return JsonResponse(openai_error_json(error), status_code=error.status, headers=openai_headers(error))
