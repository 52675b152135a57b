"""The constraint that enforces a required or named tool call: one or more calls (one where parallel
calls are off) in the tool-call format, each naming a declared function with arguments valid against its
schema, objects closed (server/closed_objects.py; llguidance's Lark with an inline JSON schema)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from server.closed_objects import close_objects
from server.tools.format import CLOSE, OPEN, parameters
from wire.constraint import Constraint, Tool, ToolChoice


def call_schema(tools: Sequence[Tool]) -> dict[str, object]:
    return {
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": close_objects(parameters(t))},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ],
    }


def tool_constraint(tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool) -> Constraint | None:
    """The grammar for `required` or a named function; None where the model may write text."""
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
