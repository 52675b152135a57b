"""Strict structured outputs and tool calls (issue 34 item 5, issue 36 item 3), through the real server and
shim with the official openai SDK: an object schema that lists properties and does not state
`additionalProperties` admits no other key (in tool calls and response_format alike), a caller who wants
other keys says `"additionalProperties": true`, and `strict` means what OpenAI says it means."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import openai
import pytest

from tests.support.processes import ShimProcess

LAKE = {"type": "object", "properties": {"lake": {"type": "string", "maxLength": 12}}, "required": ["lake"]}
ANOTHER_KEY = re.compile(r'\{"lake": "(?:[^"\\]|\\.)*", "')  # the lake, then a key of the model's own
ASK = [{"role": "user", "content": "Which lake is deepest?"}]
SEEDS = range(5)


def lake_tool(parameters: dict[str, object], *, strict: bool | None = None) -> dict[str, object]:
    function: dict[str, object] = {"name": "find_lake", "parameters": parameters}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


@pytest.fixture
def sdk(shim: ShimProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def test_tool_arguments_admit_no_key_the_schema_does_not_list(sdk: openai.OpenAI) -> None:
    """Issue 34 item 5: on 6c0ff0d the byte LM added keys of its own in 2 of these 5 seeds."""
    for seed in SEEDS:
        answer = sdk.chat.completions.create(
            model="byte-lm", messages=ASK, tools=[lake_tool(LAKE)], tool_choice="required",  # type: ignore[list-item, arg-type]
            parallel_tool_calls=False, seed=seed, max_tokens=120,
        )  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice)
        (call,) = choice.message.tool_calls or []
        assert set(json.loads(call.function.arguments)) <= {"lake"}, (seed, call.function.arguments)


def test_response_format_admits_no_key_the_schema_does_not_list(sdk: openai.OpenAI) -> None:
    for seed in SEEDS:
        answer = sdk.chat.completions.create(
            model="byte-lm", messages=ASK, seed=seed, max_tokens=120,
            response_format={"type": "json_schema", "json_schema": {"name": "lake", "schema": LAKE}},  # type: ignore[typeddict-item]
        )  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (seed, choice.message.content)
        assert set(json.loads(choice.message.content or "")) <= {"lake"}, (seed, choice.message.content)


def test_additional_properties_true_lets_other_keys_in(sdk: openai.OpenAI) -> None:
    """The other choice is the caller's, stated in the schema: with it some seed writes a key of its own."""
    open_lake = {**LAKE, "additionalProperties": True}
    contents = []
    for seed in SEEDS:
        answer = sdk.chat.completions.create(
            model="byte-lm", messages=ASK, seed=seed, max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "lake", "schema": open_lake}},  # type: ignore[typeddict-item]
        )  # fmt: skip
        contents.append(answer.choices[0].message.content or "")
    assert any(ANOTHER_KEY.match(content) for content in contents), contents
