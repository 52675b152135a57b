"""How the Responses family refuses a request, as OpenAI's API does: a 400 naming the parameter (`param`) for
what it cannot honour (`Unsupported`), for parameters at odds with each other (`ParamError`), for one it does
not know, and for any value that fails validation; a 404 for a response it does not hold. `parse()` reads the
body into the request model and turns pydantic's errors into these."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc
from pydantic import BaseModel, ValidationError

from shim.admission.request_body import json_path, parse_json, validation_error
from shim.errors import SHIM_DOMAIN, ErrorBody, FieldViolation, ShimError
from shim.refusals import invalid_argument

ModelT = TypeVar("ModelT", bound=BaseModel)
RESPONSE_NOT_FOUND = "RESPONSE_NOT_FOUND"


class Unsupported(ValueError):
    """A parameter Sluice does not honour; `param` names it (relative to where it was found)."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(f"{param} is not supported: {why}")
        self.param = param


class ParamError(ValueError):
    """A parameter at odds with the rest of the request; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _type_of(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else None


def refuse_kinds(
    values: Any,
    param: str,
    kinds: Iterable[str],
    what: str,
    *,
    kind_of: Callable[[Any], Any] = _type_of,
) -> None:
    """Raises Unsupported naming `param[i].type` for the first entry of a list whose kind (a string) is not
    among `kinds`: a type OpenAI knows that Sluice does not serve. Anything else is left to validation."""
    if not isinstance(values, list):
        return
    known = set(kinds)
    for index, value in enumerate(values):
        kind = kind_of(value)
        if isinstance(kind, str) and kind not in known:
            raise Unsupported(f"{param}[{index}].type", f"{kind!r}; Sluice takes {what}")


def _untagged(location: tuple[int | str, ...], document: Any) -> tuple[int | str, ...]:
    """`location` without the labels pydantic adds for a union's member (`input.list[...].2.message.content`):
    within the document, a name that cannot index a list, or one an object lacks with more location after
    it (a missing field is the last name)."""
    kept: list[int | str] = []
    node = document
    for index, part in enumerate(location):
        inside = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if inside or (isinstance(node, dict) and part in node):
            node = node[part]
        elif isinstance(node, list) or (isinstance(node, dict) and index < len(location) - 1):
            continue  # a label, no place in the document
        kept.append(part)
    return tuple(kept)


def _param(location: tuple[int | str, ...], relative: str, document: Any) -> str:
    """Where a nested validator's refusal stands: the path to the field that raised it, then the name it
    gave relative to that field (`content[0].type` in `input[2]` is `input[2].content[0].type`)."""
    where = json_path(_untagged(location, document), document) if location else ""
    head, _, _ = where.rpartition(".")
    last = where.rpartition(".")[2].split("[")[0]
    if where and relative.split("[")[0].split(".")[0] == last:
        where = head if "." in where else ""
    return f"{where}.{relative}" if where else relative


def parse(raw: bytes, schema: type[ModelT]) -> ModelT:
    """The body as `schema`; every refusal is a 400 naming the parameter, as OpenAI's API answers."""
    document = parse_json(raw)
    try:
        return schema.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        for error in errors:
            cause = error.get("ctx", {}).get("error")
            if isinstance(cause, Unsupported | ParamError):
                param = _param(tuple(error["loc"]), cause.param, document)
                message = str(cause).replace(cause.param, param, 1)
                unsupported = isinstance(cause, Unsupported)
                reason = "UNSUPPORTED_PARAMETER" if unsupported else "CONFLICTING_PARAMETERS"
                raise invalid_argument(
                    message, reason=reason, violations=(FieldViolation(param, message),)
                ) from None
            if error["type"] == "extra_forbidden":
                name = json_path(_untagged(tuple(error["loc"]), document), document)
                message = f"unrecognized request argument supplied: {name}"
                violation = FieldViolation(name, message)
                raise invalid_argument(message, reason="UNKNOWN_PARAMETER", violations=(violation,)) from None
        # The deepest first: of a union's members (`input` as text or as items) the one that came closest.
        located = [(_untagged(tuple(error["loc"]), document), error) for error in errors]
        located.sort(key=lambda pair: len(pair[0]), reverse=True)
        refused = validation_error([{**error, "loc": path} for path, error in located], document=document)
        raise ShimError(refused.body, status=400) from None


def response_not_found(response_id: str, *, param: str | None) -> ShimError:
    """404 for a response this process does not hold (never stored, expired, evicted, or another
    token's), in the family's shape; `param` names the field that asked for it, if one did."""
    message = f"Response with id {response_id!r} not found."
    violations = (FieldViolation(param, message),) if param else ()
    body = ErrorBody(
        code=grpc.StatusCode.NOT_FOUND,
        message=message,
        reason=RESPONSE_NOT_FOUND,
        domain=SHIM_DOMAIN,
        field_violations=violations,
    )
    return ShimError(body, status=404)
