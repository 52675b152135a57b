"""Reading a request body the shim's way: size first (Content-Length, then counted while streaming),
then JSON, then the pydantic schema, so that cheap refusals come before expensive parsing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from shim.errors import FieldViolation, ShimError, invalid_argument, request_too_large

ModelT = TypeVar("ModelT", bound=BaseModel)


def json_path(location: Sequence[int | str]) -> str:
    """A pydantic error location as the JSON path a caller recognises, e.g. `inputs[0].shape`."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    # An empty location is a whole-object rule, such as "exactly one of prompt or prompt_token_ids".
    return path or "$"


def validation_error(errors: Sequence[Any], *, skip_prefix: int = 0) -> ShimError:
    """A 422 naming each failing JSON field; `skip_prefix` drops FastAPI's `body`/`path` location head."""
    violations = tuple(
        FieldViolation(json_path(tuple(error["loc"])[skip_prefix:]), str(error["msg"])) for error in errors
    )
    fields = ", ".join(violation.field for violation in violations)
    return invalid_argument(
        f"request validation failed: {fields}", reason="VALIDATION_FAILED", violations=violations, status=422
    )


async def read_bounded(request: Request, *, limit: int) -> bytes:
    """The body, refused with 413 before reading when Content-Length is too big, or once the count is."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError as exc:
            raise invalid_argument("Content-Length is not an integer", reason="INVALID_HEADER") from exc
        if declared_bytes > limit:
            raise request_too_large(limit)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise request_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(request: Request, schema: type[ModelT], *, limit: int) -> ModelT:
    """Reads, decodes and validates a JSON body into `schema`."""
    raw = await read_bounded(request, limit=limit)
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid_argument(f"request body is not valid JSON: {exc}", reason="MALFORMED_JSON") from exc
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from exc
