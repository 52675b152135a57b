"""Reading a request body the shim's way, cheapest refusal first: the media type and the declared size
from the headers, then the bytes (counted, and against a deadline), then JSON, then the pydantic schema.

Reading happens in the admission middleware, before routing; routes parse the bytes it read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.types import Receive

from shim import jsonio
from shim.errors import FieldViolation, ShimError
from shim.refusals import invalid_argument, request_timeout, request_too_large, unsupported_media_type

ModelT = TypeVar("ModelT", bound=BaseModel)


def is_json_media_type(content_type: str | None) -> bool:
    """application/json or any application/...+json type (RFC 6839), with any parameters (charset=...)."""
    if content_type is None:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def check_json_media_type(headers: Headers) -> None:
    """Refuses (415) a body that does not declare JSON: no web page can send application/json to
    another origin without a CORS preflight, while a text/plain form post needs none."""
    content_type = headers.get("content-type")
    if not is_json_media_type(content_type):
        raise unsupported_media_type(content_type)


def declared_length(headers: Headers, *, limit: int) -> int | None:
    """The Content-Length, refused with 413 when over `limit`, or None for a chunked body."""
    declared = headers.get("content-length")
    if declared is None:
        return None
    # int() would accept " 12", "+12" and "1_2"; HTTP allows only digits.
    if not declared.isdigit() or not declared.isascii():
        raise invalid_argument(
            "Content-Length must be a non-negative integer",
            reason="INVALID_HEADER",
            violations=(FieldViolation("Content-Length", f"not a byte count: {declared!r}"),),
        )
    if len(declared) > len(str(limit)) or int(declared) > limit:
        raise request_too_large(limit)
    return int(declared)


async def read_body(receive: Receive, headers: Headers, *, limit: int, timeout_s: float) -> bytes:
    """The whole body: 413 as soon as it is known to exceed `limit`, 408 if it is not all there within
    `timeout_s` of the headers (a slow sender otherwise holds its connection, and memory, for ever)."""
    declared_length(headers, limit=limit)
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientLeft
                chunk: bytes = message.get("body", b"")
                received += len(chunk)
                if received > limit:
                    raise request_too_large(limit)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise request_timeout("body", timeout_s) from None


class ClientLeft(Exception):
    """The client disconnected before its body was complete: there is nobody left to answer."""


def parse_json(raw: bytes) -> Any:
    """The JSON document in `raw` (strict: see shim/jsonio.py); anything else is a 400."""
    return jsonio.loads(raw)


_NO_DOCUMENT = object()


def json_path(location: Sequence[int | str], document: Any = _NO_DOCUMENT) -> str:
    """A pydantic error location as the JSON path a caller recognises, e.g. `inputs[0].shape`.

    With the `document` the location is resolved against it, and the labels pydantic adds that are no
    place in the document (a union member such as `str`, a dict's `[key]`) are left out.
    """
    path = ""
    node = document
    resolving = document is not _NO_DOCUMENT
    for part in location:
        if part == "[key]":
            continue
        if resolving:
            if isinstance(node, dict) and isinstance(part, str):
                # A name the document lacks is a missing field: named, and the end of the document.
                resolving = part in node
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    # An empty location is a whole-object rule, such as "exactly one of prompt or prompt_token_ids".
    return path or "$"


def validation_error(
    errors: Sequence[Any], *, skip_prefix: int = 0, document: Any = _NO_DOCUMENT
) -> ShimError:
    """A 422 naming each failing JSON field; `skip_prefix` drops FastAPI's `body`/`path` location head."""
    violations: list[FieldViolation] = []
    for error in errors:
        violation = FieldViolation(json_path(tuple(error["loc"])[skip_prefix:], document), str(error["msg"]))
        if violation not in violations[-4:]:  # a union's members often say the same thing
            violations.append(violation)
    fields = ", ".join(dict.fromkeys(violation.field for violation in violations[:8]))
    more = f" and {len(violations) - 8} more" if len(violations) > 8 else ""
    return invalid_argument(
        f"request validation failed: {fields}{more}",
        reason="VALIDATION_FAILED",
        violations=tuple(violations),
        status=422,
    )


def parse_body(raw: bytes, schema: type[ModelT]) -> ModelT:
    """Decodes and validates a JSON body, already read in full, into `schema`."""
    document = parse_json(raw)
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False, include_input=False), document=document) from exc
    except RecursionError:
        raise invalid_argument(
            "request body is nested too deeply to validate", reason="MALFORMED_JSON"
        ) from None
