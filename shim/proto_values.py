"""Pydantic types for the JSON values of a request body that travel in protobuf fields, shared by every API
family's request models: what such a field can carry is the wire's rule, not a family's."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from wire.sampling import Bound

_INT32_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1


def utf8(text: str) -> str:
    """`text`, refused (ValueError) where it holds a lone surrogate."""
    # JSON may spell a lone surrogate ("\udc80"), which no UTF-8 protobuf string can carry.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"must be Unicode text; character {exc.start} is a lone surrogate") from None
    return text


# Every string field of a body is Text: it reaches protobuf, which accepts only valid UTF-8.
Text = Annotated[str, AfterValidator(utf8)]
Int32 = Annotated[int, Field(ge=-(2**31), le=_INT32_MAX)]
UInt64 = Annotated[int, Field(ge=0, le=_UINT64_MAX)]


def within(bound: Bound, *, high: float | None = None) -> Any:
    """The pydantic constraint of a sampling field's declared range (wire/sampling.py), so that a family
    refuses what the server would; `high` narrows it where the family's API stops lower."""
    above = bound.low if bound.open_low else None
    least = None if bound.open_low else bound.low
    return Field(gt=above, ge=least, le=high if high is not None else bound.high)
