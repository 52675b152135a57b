"""request_body.py: JSON media types, declared lengths, and JSON documents Python reads badly (deep
nesting, integers past 4,300 digits, NaN and numbers past a double) refused as MALFORMED_JSON."""

from __future__ import annotations

import json

import pytest
from starlette.datastructures import Headers

from shim.admission.request_body import declared_length, is_json_media_type, json_path, parse_body, parse_json
from shim.errors import ShimError
from shim.native.request_models import GenerateBody, InferBody


@pytest.mark.parametrize(
    ("content_type", "is_json"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        (" APPLICATION/JSON ;charset=UTF-8", True),
        ("application/problem+json", True),
        ("text/plain", False),
        ("text/plain; application/json", False),
        ("application/jsonx", False),
        ("application/x-www-form-urlencoded", False),
        ("json", False),
        ("", False),
        (None, False),
    ],
)
def test_json_media_types(content_type: str | None, is_json: bool) -> None:
    assert is_json_media_type(content_type) is is_json


def test_declared_length() -> None:
    assert declared_length(Headers({}), limit=10) is None
    assert declared_length(Headers({"content-length": "10"}), limit=10) == 10
    with pytest.raises(ShimError) as too_large:
        declared_length(Headers({"content-length": "1" + "0" * 400}), limit=10)
    assert too_large.value.status == 413
    with pytest.raises(ShimError) as not_digits:
        declared_length(Headers({"content-length": "+1"}), limit=10)
    assert (not_digits.value.status, not_digits.value.body.reason) == (400, "INVALID_HEADER")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"seed": ' + b"9" * 5000 + b"}", "out of range"),
        (b'{"temperature": NaN}', "not valid JSON"),
        (b'{"temperature": -Infinity}', "not valid JSON"),
        (b'{"temperature": 1e400}', "out of range"),
        (rb'{"prompt": "\udc80"}', "lone UTF-16 surrogate"),
        (b'{"prompt": "\xff"}', "not UTF-8"),
        (b'{"model": ', "not valid JSON"),
    ],
)
def test_documents_python_reads_badly_are_malformed_json(raw: bytes, says: str) -> None:
    with pytest.raises(ShimError) as caught:
        parse_json(raw)
    assert caught.value.status == 400
    assert caught.value.body.reason == "MALFORMED_JSON"
    assert says in caught.value.body.message


def test_ordinary_numbers_still_parse() -> None:
    assert parse_json(b'{"a": [1, -2.5e3, 1e308, 12345678901234567890]}') == {
        "a": [1, -2500.0, 1e308, 12345678901234567890]
    }


@pytest.mark.parametrize(
    "raw", [rb'{"model": "g", "prompt": "\udc80"}', b'{"model": "g", "prompt": "\xed\xb2\x80"}']
)
def test_a_lone_surrogate_escaped_or_encoded_is_malformed_json(raw: bytes) -> None:
    with pytest.raises(ShimError) as caught:
        parse_body(raw, GenerateBody)
    assert (caught.value.status, caught.value.body.reason) == (400, "MALFORMED_JSON")
    assert "surrogate" in caught.value.body.message or "not UTF-8" in caught.value.body.message


def test_many_violations_are_listed_boundedly() -> None:
    raw = b'{"model": "g", "prompt_token_ids": [' + b",".join([b"null"] * 10_000) + b"]}"
    with pytest.raises(ShimError) as caught:
        parse_body(raw, GenerateBody)
    error = caught.value.to_json()["error"]
    assert len(error["field_violations"]) == 33
    assert error["field_violations"][-1] == {
        "field": "…",
        "description": "9968 more field violations not shown",
    }
    assert error["message"].endswith("and 9992 more")


def test_violations_name_places_in_the_document_not_pydantic_labels() -> None:
    raw = json.dumps(
        {
            "model": "m",
            "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [None]}],
            "parameters": {"k": [1]},
        }
    ).encode()
    with pytest.raises(ShimError) as caught:
        parse_body(raw, InferBody)
    fields = [violation.field for violation in caught.value.body.field_violations]
    # Named where they are in the document, not at pydantic's union labels (`parameters.k.bool` etc.).
    assert set(fields) == {"inputs[0].data", "parameters.k"}
    assert caught.value.body.message == "request validation failed: inputs[0].data, parameters.k"


def test_a_missing_field_is_named() -> None:
    with pytest.raises(ShimError) as caught:
        parse_body(b'{"prompt": "x"}', GenerateBody)
    assert [violation.field for violation in caught.value.body.field_violations] == ["model"]


def test_json_path_without_a_document_keeps_every_part() -> None:
    assert json_path(("inputs", 0, "data", 2, "bool")) == "inputs[0].data[2].bool"
    assert json_path(()) == "$"
