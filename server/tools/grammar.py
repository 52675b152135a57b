"""The constraints over tool calls, in llguidance's Lark with inline JSON schemas (objects closed,
server/closed_objects.py). `required` or a named function: one or more calls (one where parallel calls
are off), each naming a declared function with arguments valid against its schema. `auto` where a function
is strict: any text, and once the model writes the call tag (a lazy lexeme: the first tag ends the text)
only calls follow, a strict function's arguments valid against its schema and any other's an object."""

from __future__ import annotations

import json
from collections.abc import Sequence

from server.bounded_numbers import bound_numbers
from server.closed_objects import close_objects
from server.tools.format import CLOSE, OPEN, parameters
from wire.constraint import Constraint, Tool, ToolChoice

ANY_OBJECT: dict[str, object] = {"type": "object"}


def call_schema(tools: Sequence[Tool], *, strict_only: bool = False) -> dict[str, object]:
    """One call's JSON; with `strict_only`, a function that is not strict takes any arguments object."""
    return {
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t.name},
                    "arguments": _arguments(t) if t.strict or not strict_only else ANY_OBJECT,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ],
    }


def _arguments(tool: Tool) -> dict[str, object]:
    """The function's parameters with Sluice's schema defaults: objects closed, numbers bounded."""
    schema: dict[str, object] = bound_numbers(close_objects(parameters(tool)))
    return schema


def tool_constraint(tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool) -> Constraint | None:
    """The grammar for `required`, a named function, or `auto` with a strict function; None where the
    model's text is free."""
    if choice.mode == "auto" and any(t.strict for t in tools):
        return _auto_grammar(tools, parallel=parallel)
    if choice.mode != "required":
        return None
    chosen = [t for t in tools if choice.function is None or t.name == choice.function]
    calls = "call+" if parallel and choice.function is None else "call"
    grammar = (
        f"start: {calls}\n"
        f"call: {json.dumps(OPEN + chr(10))} body {json.dumps(chr(10) + CLOSE + chr(10))}\n"
        f"body: %json {json.dumps(call_schema(chosen))}\n"
    )
    return Constraint.grammar(grammar, "lark")


def _auto_grammar(tools: Sequence[Tool], *, parallel: bool) -> Constraint:
    # `opened` is lazy: it ends at the first tag, where TEXT alone would run on, so a tag starts a call.
    more = " call*" if parallel else ""
    close = json.dumps(chr(10) + CLOSE + chr(10))
    grammar = (
        "%llguidance {}\n"
        f"start: TEXT | opened body {close}{more}\n"
        f"opened[lazy]: TEXT {json.dumps(OPEN)}\n"
        f"call: {json.dumps(OPEN)} body {close}\n"
        f'body: "\\n" %json {json.dumps(call_schema(tools, strict_only=True))}\n'
        "TEXT: /(.|\\n)*/\n"
    )
    return Constraint.grammar(grammar, "lark")
