"""Bounded numbers (issue 38 item 5): a numeric schema without a bound on a side gets the safe-integer
bound there, so the grammar ends an integer within 16 digits where it let SmolLM2 write `1111…` until
max_tokens; a bound the caller states is kept."""

from __future__ import annotations

import json

import llguidance
import pytest

from server.bounded_numbers import SAFE_INTEGER, bound_numbers
from server.logits.grammar import to_grammar
from server.logits.schema_check import ByteVocabulary
from wire.constraint import Constraint


def accepts(schema: dict[str, object], text: str) -> bool:
    tokenizer = llguidance.LLTokenizer(ByteVocabulary(), n_vocab=257)
    matcher = llguidance.LLMatcher(
        tokenizer, to_grammar(Constraint.json_schema(json.dumps(schema))), log_level=0
    )
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


POPULATION = {"type": "object", "properties": {"population": {"type": "integer"}}, "required": ["population"]}


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (str(SAFE_INTEGER), True),
        (str(-SAFE_INTEGER), True),
        ("2148000", True),
        (str(SAFE_INTEGER + 1), False),
        ("1" * 17, False),  # the endless integer stops being possible at 16 digits
    ],
)
def test_an_integer_without_bounds_holds_a_safe_integer(value: str, accepted: bool) -> None:
    assert accepts(POPULATION, f'{{"population": {value}}}') is accepted


def test_a_number_without_bounds_is_bounded_alike() -> None:
    share = {"type": "object", "properties": {"share": {"type": "number"}}, "required": ["share"]}
    assert accepts(share, '{"share": 0.25}')
    assert not accepts(share, '{"share": ' + "9" * 17 + "}")


def test_a_stated_bound_is_kept() -> None:
    big = {"type": "integer", "minimum": 0, "maximum": 10**30}
    assert bound_numbers(dict(big)) == big
    assert bound_numbers({"type": ["number", "null"], "exclusiveMinimum": 0}) == {
        "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": SAFE_INTEGER,
    }  # fmt: skip
    huge = {"type": "number", "minimum": 1e20}  # past the safe range: the caller wants numbers that large
    assert bound_numbers(dict(huge)) == huge


def test_only_numeric_schemas_are_touched() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "odd": {"type": {"not": "a name"}}},
              "$defs": {"n": {"type": "integer"}}}  # fmt: skip
    bounded = bound_numbers(json.loads(json.dumps(schema)))
    assert bounded["properties"] == schema["properties"]
    assert bounded["$defs"]["n"] == {"type": "integer", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
