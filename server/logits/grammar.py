"""Constraints compiled into llguidance matchers, with limits stated before anything is compiled and a
cache by content: a schema, regex, choice or grammar becomes a template matcher once, and each request
takes a copy (compiled grammars are shared between copies). Compiling runs off the event loop; llguidance
drops the GIL while it builds and bounds its own work (lexer fuel, grammar size, items per step)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from server.bounded_numbers import bound_numbers
from server.closed_objects import close_objects
from server.errors import InvalidArgument, LimitExceeded
from server.logits.vocab import grammar_tokenizer
from server.runtimes.base import GenerativeModel
from wire.constraint import Constraint

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

MAX_CONSTRAINT_CHARS = 64 * 1024  # a schema, regex or grammar's text
MAX_CHOICES = 1024
MAX_JSON_DEPTH = 64  # nesting of a schema document (objects and arrays)
CACHE_ENTRIES = 256
# llguidance's defaults are sized for interactive use; a quarter of its initial fuel keeps a hostile
# grammar's compile under ~5 ms, and step limits keep one mask under ~3 ms.
LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=250_000, step_lexer_fuel=50_000, step_max_items=20_000, max_grammar_size=100_000
)

# JSON as json.dumps writes it (", " and ": ", no other whitespace), as OpenAI's structured outputs read:
# flexible whitespace lets a weak model pad a value until max_tokens.
JSON_FORMAT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}

_FIELD = {
    "json_schema": "constraint.json_schema",
    "json_object": "constraint.json_object",
    "regex": "constraint.regex",
    "choice": "constraint.choice.options",
    "grammar": "constraint.grammar.text",
}


def json_depth(text: str) -> int:
    """The deepest nesting of objects and arrays, scanned without recursion (json.loads would recurse)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def check_size(constraint: Constraint) -> None:
    """Refuses a constraint whose text, choices or nesting are over the limits (nothing is compiled)."""
    field = _FIELD[constraint.kind]
    size = len(constraint.text) + sum(len(o) for o in constraint.options)
    if size > MAX_CONSTRAINT_CHARS:
        raise LimitExceeded(
            f"the {constraint.kind} constraint has {size} characters; at most {MAX_CONSTRAINT_CHARS}",
            field=field,
            metadata={"max_constraint_chars": MAX_CONSTRAINT_CHARS},
        )
    if len(constraint.options) > MAX_CHOICES:
        raise LimitExceeded(
            f"{len(constraint.options)} choices; at most {MAX_CHOICES}",
            field=field,
            metadata={"max_choices": MAX_CHOICES},
        )
    if constraint.kind == "json_schema" and json_depth(constraint.text) > MAX_JSON_DEPTH:
        raise LimitExceeded(
            f"the schema nests deeper than {MAX_JSON_DEPTH} levels",
            field=field,
            metadata={"max_json_depth": MAX_JSON_DEPTH},
        )


def to_grammar(constraint: Constraint) -> str:
    """llguidance's grammar text for the constraint; InvalidArgument naming the field when it cannot be."""
    field = _FIELD[constraint.kind]
    try:
        if constraint.kind == "json_schema":
            schema = json.loads(constraint.text)
            if not isinstance(schema, dict | bool):
                raise InvalidArgument("a JSON schema is an object or a boolean", field=field)
            closed = json.dumps(bound_numbers(close_objects(schema)))
            json_options: JsonCompileOptions = {**JSON_FORMAT, "lenient": constraint.lenient}
            return str(llguidance.LLMatcher.grammar_from_json_schema(closed, json_options))
        if constraint.kind == "json_object":
            return str(llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', JSON_FORMAT))
        if constraint.kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(constraint.text))
        if constraint.kind == "choice":
            options = " | ".join(json.dumps(option) for option in constraint.options)
            return str(llguidance.LLMatcher.grammar_from_lark(f"start: {options}\n"))
        text = any_to_lark(constraint.text) if constraint.syntax == "gbnf" else constraint.text
        return str(llguidance.LLMatcher.grammar_from_lark(text))
    except InvalidArgument:
        raise
    except Exception as error:
        raise InvalidArgument(f"invalid {constraint.kind}: {str(error)[:200]}", field=field) from None


class GrammarCompiler:
    """One model's compiled constraints, least recently used evicted."""

    def __init__(self, model: GenerativeModel) -> None:
        self.model = model
        self._cache: OrderedDict[Constraint, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = self.hits = 0

    def check(self, constraint: Constraint) -> None:
        """What can be refused without compiling (call on the event loop, before any slot is taken)."""
        if self.model.eos_id is None:
            raise InvalidArgument(
                "this model has no end-of-sequence token, so a constraint could never end", field="constraint"
            )
        check_size(constraint)

    def cached(self, constraint: Constraint) -> llguidance.LLMatcher | None:
        """A copy of the cached template (about 0.1 ms: fine on the event loop), or None."""
        with self._lock:
            template = self._cache.get(constraint)
            if template is None:
                return None
            self._cache.move_to_end(constraint)
            self.hits += 1
        return template.deep_copy()

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for one request (call off the event loop); the compiled template is cached."""
        self.check(constraint)
        copy = self.cached(constraint)
        if copy is not None:
            return copy
        grammar = to_grammar(constraint)
        template = llguidance.LLMatcher(grammar_tokenizer(self.model), grammar, log_level=0, limits=LIMITS)
        if template.is_error():
            raise InvalidArgument(
                f"invalid {constraint.kind}: {template.get_error()[:200]}", field=_FIELD[constraint.kind]
            )
        with self._lock:
            self.compiled += 1
            self._cache[constraint] = template
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return template.deep_copy()
