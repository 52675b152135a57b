"""The Anthropic family's error shape, `{"type": "error", "error": {"type", "message"}, "request_id"}`,
from the shim's one code table (shim/errors.py), with the statuses Anthropic's API answers: the server's
and the shim's overload (a full queue, memory, no upstream, not ready, draining) is 529 `overloaded_error`,
a caller's own quota 429 `rate_limit_error`; both carry `retry-after` (seconds) and `retry-after-ms`, which
the official SDKs wait for before they retry."""

from __future__ import annotations

from typing import Any

from shim.errors import ErrorBody, ShimError
from shim.identity import current_request_id
from shim.jsonio import JsonResponse
from wire import errors as reasons

OVERLOADED = 529  # Anthropic's status for an API that is overloaded
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}
# RESOURCE_EXHAUSTED reasons that say the server is full, not that the caller spent its share.
_SERVER_FULL = frozenset((reasons.QUEUE_FULL, reasons.OUT_OF_MEMORY))

_TEXT = {"type": "string"}
#: The family's error body, for every error status /openapi.json documents.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": _TEXT, "message": _TEXT},
        },
        "request_id": {"type": ["string", "null"]},
    },
}


def anthropic_status(error: ShimError) -> int:
    if error.status == 503 or (error.status == 429 and error.body.reason in _SERVER_FULL):
        return OVERLOADED
    return error.status


def described(body: ErrorBody) -> str:
    """The message, naming the field; a validation failure says what each (of the first three) lacks."""
    violations = body.field_violations
    if body.reason == "VALIDATION_FAILED" and violations:
        return "; ".join(f"{v.field}: {v.description}" for v in violations[:3])
    if violations and violations[0].field not in body.message:
        return f"{violations[0].field}: {body.message}"
    return body.message


def error_json(body: ErrorBody, status: int) -> dict[str, Any]:
    kind = _TYPE_BY_STATUS.get(status, "api_error")
    message = described(body)
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": current_request_id()}


def error_response(error: ShimError) -> JsonResponse:
    """The family's error shape (shim.families.ErrorShape), for its routes' errors and refusals alike."""
    status = anthropic_status(error)
    headers = error.headers
    if error.body.retry_after_s is not None:
        headers["retry-after-ms"] = str(max(1, round(error.body.retry_after_s * 1000)))
    return JsonResponse(error_json(error.body, status), status_code=status, headers=headers)
