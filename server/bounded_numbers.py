"""Bounded numbers: the second default Sluice adds to a JSON schema before it is compiled (after closed
objects, server/closed_objects.py). An `integer` or `number` schema that states no lower bound gets
`minimum` -(2**53 - 1), and one that states no upper bound gets `maximum` 2**53 - 1: the integers every
JSON reader holds exactly (I-JSON, RFC 7493; JavaScript's Number.MAX_SAFE_INTEGER), 16 digits at most, as
llama.cpp's JSON grammars allow (`[1-9] [0-9]{0,15}`). JSON Schema itself bounds nothing, and a weak model
then writes `1111…` until max_tokens. A bound the caller states is kept, however wide."""

from __future__ import annotations

from typing import Any

from server.closed_objects import subschemas

SAFE_INTEGER = 2**53 - 1
_NUMERIC = frozenset({"integer", "number"})


def bound_numbers(schema: Any) -> Any:
    """`schema` (freshly parsed: it is changed in place) with the missing side of every numeric schema's
    range filled in; a schema whose `type` names no number is left alone, and so is a missing side whose
    other side is already past the safe range (the caller asked for numbers that large)."""
    for node in subschemas(schema):
        kind = node.get("type")
        kinds = {k for k in (kind if isinstance(kind, list) else [kind]) if isinstance(k, str)}
        if not kinds & _NUMERIC:
            continue
        low, high = _bound(node, "minimum", "exclusiveMinimum"), _bound(node, "maximum", "exclusiveMaximum")
        if low is None and (high is None or high > -SAFE_INTEGER):
            node["minimum"] = -SAFE_INTEGER
        if high is None and (low is None or low < SAFE_INTEGER):
            node["maximum"] = SAFE_INTEGER
    return schema


def _bound(node: dict[str, Any], inclusive: str, exclusive: str) -> float | None:
    """The side's stated bound; a draft-4 boolean `exclusive*` qualifies the inclusive one."""
    values = [node.get(inclusive), node.get(exclusive)]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if numbers:
        return float(numbers[0])
    return 0.0 if inclusive in node or exclusive in node else None  # stated, but no number: left as given
