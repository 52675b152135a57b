"""ToolOutput: what a generation with tools writes, split into the text the caller sees and the calls.
Text streams as usual until the call tag begins; from there it is withheld (a tag that may still be
starting is held back, as stop strings are), and when the stream ends the withheld text is parsed into
calls. Where it does not parse (a call cut off by max_tokens, or `auto` text that only looked like one),
it is released as text, as vLLM's tool parsers do."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from server.tools.format import CLOSE, OPEN
from wire.constraint import ToolCall

# Whether a call's arguments may be reported: (function name, arguments) -> valid. A strict function's
# arguments written without its schema's mask are checked by one (server/batching/shaping.py).
ArgumentCheck = Callable[[str, dict[str, Any]], bool]


class ToolOutput:
    def __init__(self, names: frozenset[str], *, required: bool, check: ArgumentCheck | None = None) -> None:
        self.names = names
        self.check = check
        self.capturing = required  # a required call: everything is the call
        self.held = ""
        self.captured = ""

    def feed(self, text: str) -> str:
        """The part of `text` the caller may see now."""
        if self.capturing:
            self.captured += text
            return ""
        self.held += text
        at = self.held.find(OPEN)
        if at >= 0:
            visible, self.captured, self.held = self.held[:at], self.held[at:], ""
            self.capturing = True
            return visible
        keep = _partial_tag(self.held)
        visible = self.held[: len(self.held) - keep]
        self.held = self.held[len(visible) :]
        return visible

    def finish(self, *, cut: bool = False) -> tuple[str, tuple[ToolCall, ...]]:
        """The text still to show and the calls, when the stream ends; `cut` (max_tokens) drops a last call
        left incomplete after complete ones."""
        calls, complete = parse_calls(self.captured, self.names, self.check) if self.captured else ((), True)
        if calls and (complete or cut):
            return self.held, calls
        return self.held + self.captured, ()


def _partial_tag(text: str) -> int:
    """How many trailing characters could be the start of the call tag."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def parse_calls(
    text: str, names: frozenset[str], check: ArgumentCheck | None = None
) -> tuple[tuple[ToolCall, ...], bool]:
    """The calls that parse, in order, and whether that was the whole text (no incomplete or stray rest);
    a call that names no declared function, whose arguments are no object, or that `check` refuses, ends
    the parse."""
    calls: list[ToolCall] = []
    rest = text.strip()
    while rest:
        end = rest.find(CLOSE)
        if not rest.startswith(OPEN) or end < 0:
            return tuple(calls), False
        try:
            value = json.loads(rest[len(OPEN) : end])
        except ValueError:
            return tuple(calls), False
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if not isinstance(arguments, dict) or value.get("name") not in names:
            return tuple(calls), False
        if check is not None and not check(value["name"], arguments):
            return tuple(calls), False
        calls.append(ToolCall(f"call_{secrets.token_hex(12)}", value["name"], json.dumps(arguments)))
        rest = rest[end + len(CLOSE) :].strip()
    return tuple(calls), True
