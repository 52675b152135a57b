"""ToolOutput: what a generation with tools writes, split into the text the caller sees and the calls.
Text streams as usual until the call tag begins; from there it is withheld (a tag that may still be
starting is held back, as stop strings are), and when the stream ends the withheld text is parsed into
calls. Where it does not parse (a call cut off by max_tokens, or `auto` text that only looked like one),
it is released as text, as vLLM's tool parsers do. A call identical to one already made (the same name
and arguments) ends the calls as soon as its JSON closes: it is dropped and the calls made are reported
(`repeated`; docs/constrained.md says why)."""

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
        self.repeated = False  # a call was made again: the calls end (the caller ends the stream)
        self._made: set[tuple[str, str]] = set()  # (name, arguments as canonical JSON) of calls closed
        self._next = 0  # where in `captured` the next call's tag is looked for

    def feed(self, text: str) -> str:
        """The part of `text` the caller may see now."""
        if self.capturing:
            self.captured += text
            if "}" in text:  # a call's JSON can only close at a brace
                self._watch()
            return ""
        self.held += text
        at = self.held.find(OPEN)
        if at >= 0:
            visible, self.captured, self.held = self.held[:at], self.held[at:], ""
            self.capturing = True
            self._watch()
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

    def _watch(self) -> None:
        """Notes each call whose JSON has closed; one equal to a call already made is cut from the
        captured text and ends the calls."""
        while not self.repeated:
            at = self.captured.find(OPEN, self._next)
            if at < 0:
                return
            start = at + len(OPEN)
            start += len(self.captured[start:]) - len(self.captured[start:].lstrip())
            try:
                value, end = _DECODER.raw_decode(self.captured, start)
            except (ValueError, RecursionError):
                return  # not closed yet (or no JSON: the parse at the end decides)
            self._next = end
            if not isinstance(value, dict):
                continue
            key = (str(value.get("name")), json.dumps(value.get("arguments"), sort_keys=True))
            if key in self._made:
                self.captured, self.repeated = self.captured[:at], True
            self._made.add(key)


_DECODER = json.JSONDecoder()


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
