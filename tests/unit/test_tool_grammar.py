"""The tool grammars over bytes (issue 36 item 3): under `auto` with a strict function the text is free
until the call tag, and from the tag on only calls follow, a strict function's arguments valid against
its closed schema and any other function's any object; the check used where no grammar masked a call
agrees with the grammar."""

from __future__ import annotations

import json

import llguidance
import pytest

from server.logits.grammar import to_grammar
from server.logits.schema_check import ByteVocabulary, SchemaCheck
from server.tools.grammar import tool_constraint
from wire.constraint import Tool, ToolChoice

ZONE = {"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"]}
CLOCK = Tool("get_time", "", json.dumps(ZONE), strict=True)
NOTE = Tool("note", "", json.dumps(ZONE))  # not strict


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>\n'


def accepts(text: str, *, parallel: bool = True) -> bool:
    constraint = tool_constraint([CLOCK, NOTE], ToolChoice("auto"), parallel=parallel)
    assert constraint is not None
    tokenizer = llguidance.LLTokenizer(ByteVocabulary(), n_vocab=257)
    matcher = llguidance.LLMatcher(tokenizer, to_grammar(constraint))
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def test_auto_without_a_strict_function_has_no_grammar() -> None:
    assert tool_constraint([NOTE], ToolChoice("auto"), parallel=True) is None


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("Any text at all, < tool_call > included.\n", True),
        ("On it. " + call("get_time", '{"zone": 3}'), True),
        (call("get_time", '{"zone": 3}') + call("note", '{"anything": [1]}'), True),
        ("On it. " + call("get_time", '{"zone": "three"}'), False),
        ("On it. " + call("get_time", '{"zone": 3, "city": "Oslo"}'), False),  # closed by default
        ("On it. " + call("get_weather", '{"zone": 3}'), False),  # no such function
        ("On it. <tool_call>\nnot a call\n</tool_call>\n", False),
        (call("get_time", '{"zone": 3}') + "and then text", False),
    ],
)
def test_once_the_tag_is_written_only_calls_follow(text: str, accepted: bool) -> None:
    assert accepts(text) is accepted


def test_one_call_when_parallel_calls_are_off() -> None:
    assert accepts(call("get_time", '{"zone": 3}'), parallel=False)
    assert not accepts(call("get_time", '{"zone": 3}') * 2, parallel=False)


def test_the_check_agrees_with_the_grammar() -> None:
    check = SchemaCheck()
    schema = json.dumps(ZONE)
    assert check.valid(schema, {"zone": 3})
    assert not check.valid(schema, {"zone": "three"})
    assert not check.valid(schema, {"zone": 3, "city": "Oslo"})
    assert not check.valid(schema, {"zone": float("nan")})
    assert check.valid(json.dumps({**ZONE, "additionalProperties": True}), {"zone": 3, "city": "Ø"})
