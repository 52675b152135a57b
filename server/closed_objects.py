"""Closed objects: the one default Sluice adds to a JSON schema before it is compiled. An object schema
that lists `properties` and says nothing of `additionalProperties` admits no other key, as xgrammar's
strict mode (vLLM's default) reads it and as OpenAI's strict mode requires it; JSON Schema itself would
admit any key, and a weak model then invents keys until max_tokens. A caller who wants other keys says so:
`"additionalProperties": true` (or a schema for them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Where a schema keeps its subschemas (JSON Schema 2020-12 and draft 7): one schema, a list of schemas, or
# a map of names to schemas. Every other value (const, enum, default, examples) is data and left alone.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "additionalProperties",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in `schema`, itself included; walked with a stack, so depth costs no recursion.
    A node may be changed in place before the walk moves past it (its children are read after the yield)."""
    stack: list[dict[str, Any]] = [schema] if isinstance(schema, dict) else []
    while stack:
        node = stack.pop()
        yield node
        children: list[Any] = [node.get(key) for key in _ONE]
        children += [item for key in _MANY if isinstance(node.get(key), list) for item in node[key]]
        children += [sub for key in _NAMED if isinstance(node.get(key), dict) for sub in node[key].values()]
        stack.extend(child for child in children if isinstance(child, dict))


def close_objects(schema: Any) -> Any:
    """`schema` (freshly parsed: it is changed in place) with `additionalProperties` false on every object
    schema that lists `properties` without stating it."""
    for node in subschemas(schema):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
    return schema
