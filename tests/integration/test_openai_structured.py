"""Structured outputs and tools through the shim with the official openai SDK (issue 20, acceptance 1):
`chat.completions.parse(response_format=PydanticModel)` unchanged, `json_schema` and `json_object`
formats, vLLM's guided_* extras on completions, required and named tool calls (whole and streamed as
OpenAI streams them), tool results in the conversation, penalties and logit_bias accepted, and two
constraints at once refused naming the second."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.processes import ShimProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]


@pytest.fixture
def sdk(shim: ShimProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused")
    yield client
    client.close()


def test_parse_with_a_pydantic_model_works_unchanged(sdk: openai.OpenAI) -> None:
    for seed in range(5):
        completion = sdk.chat.completions.parse(
            model="byte-lm",
            messages=ASK,
            response_format=Person,
            seed=seed,
            max_tokens=200,  # type: ignore[arg-type]
        )
        message = completion.choices[0].message
        assert isinstance(message.parsed, Person), message.content
        assert completion.choices[0].finish_reason == "stop"


def test_json_object_and_json_schema_formats(sdk: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    strict = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    answer = sdk.chat.completions.create(
        model="byte-lm",
        messages=ASK,
        seed=1,
        max_tokens=100,
        response_format=strict,  # type: ignore[arg-type]
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    whole = sdk.chat.completions.create(
        model="byte-lm",
        messages=ASK,
        seed=1,
        max_tokens=300,
        response_format={"type": "json_object"},  # type: ignore[arg-type]
    )
    assert isinstance(json.loads(whole.choices[0].message.content or ""), dict)


def test_vllm_guided_extras_on_completions(sdk: openai.OpenAI) -> None:
    choice = sdk.completions.create(
        model="byte-lm",
        prompt="Pick: ",
        max_tokens=16,
        seed=3,
        n=4,
        extra_body={"guided_choice": ["red", "blue"]},
    )
    assert {c.text for c in choice.choices} <= {"red", "blue"}
    regex = sdk.completions.create(
        model="byte-lm", prompt="Code: ", max_tokens=16, seed=3, extra_body={"guided_regex": "[A-F]{4}"}
    )
    assert len(regex.choices[0].text) == 4 and set(regex.choices[0].text) <= set("ABCDEF")
    grouped = sdk.completions.create(
        model="byte-lm", prompt="x", max_tokens=16, seed=3,
        extra_body={"structured_outputs": {"grammar": 'start: "a" | "b"'}},
    )  # fmt: skip
    assert grouped.choices[0].text in ("a", "b")
    as_json = {"response_format": {"type": "json_object"}}
    formatted = sdk.completions.create(
        model="byte-lm", prompt="x", max_tokens=200, seed=3, extra_body=as_json
    )
    assert isinstance(json.loads(formatted.choices[0].text), dict)  # vLLM takes response_format here too


def test_required_and_named_tool_calls_whole_and_streamed(sdk: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for tool_choice in ("required", named):
        whole = sdk.chat.completions.create(
            model="byte-lm", messages=ASK, tools=[WEATHER], tool_choice=tool_choice,  # type: ignore[arg-type]
            parallel_tool_calls=False, seed=7, max_tokens=200,
        )  # fmt: skip
        choice = whole.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]
        stream = sdk.chat.completions.create(
            model="byte-lm", messages=ASK, tools=[WEATHER], tool_choice=tool_choice,  # type: ignore[arg-type]
            parallel_tool_calls=False, seed=7, max_tokens=200, stream=True,
        )  # fmt: skip
        deltas = [c.choices[0] for c in stream if c.choices]
        calls = [d for delta in deltas for d in delta.delta.tool_calls or ()]
        assert len(calls) == 1 and calls[0].index == 0 and calls[0].id
        assert calls[0].function and calls[0].function.arguments == call.function.arguments
        assert deltas[-1].finish_reason == "tool_calls"
        assert "".join(d.delta.content or "" for d in deltas) == ""


def test_tool_results_go_back_into_the_conversation(sdk: openai.OpenAI) -> None:
    first = sdk.chat.completions.create(
        model="byte-lm", messages=ASK, tools=[WEATHER], tool_choice="required",  # type: ignore[arg-type]
        parallel_tool_calls=False, seed=2, max_tokens=200,
    )  # fmt: skip
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    history = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
    ]
    answer = sdk.chat.completions.create(
        model="byte-lm", messages=history, tools=[WEATHER], seed=2, max_tokens=8,  # type: ignore[arg-type]
        extra_body={"guided_choice": ["sunny", "rainy"]},
    )  # fmt: skip
    assert answer.choices[0].message.content in ("sunny", "rainy")
    assert answer.usage is not None and first.usage is not None
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens


def test_penalties_and_logit_bias_are_honoured(sdk: openai.OpenAI) -> None:
    forced = sdk.chat.completions.create(
        model="byte-lm",
        messages=ASK,
        temperature=0,
        max_tokens=3,
        logit_bias={"66": 100},  # type: ignore[arg-type]
    )
    assert forced.choices[0].message.content == "BBB"
    plain = sdk.chat.completions.create(model="byte-lm", messages=ASK, temperature=0, max_tokens=24)  # type: ignore[arg-type]
    penalised = sdk.chat.completions.create(
        model="byte-lm",
        messages=ASK,
        temperature=0,
        max_tokens=24,
        frequency_penalty=2,
        presence_penalty=2,  # type: ignore[arg-type]
    )
    text = penalised.choices[0].message.content or ""
    assert text != plain.choices[0].message.content
    assert max(text.count(ch) for ch in set(text)) <= max(
        (plain.choices[0].message.content or "").count(c) for c in text
    )


def test_two_constraints_at_once_are_refused_naming_the_second(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model="byte-lm", messages=ASK, response_format={"type": "json_object"},  # type: ignore[arg-type]
            extra_body={"guided_regex": "a+"},
        )  # fmt: skip
    assert caught.value.body["param"] == "guided_regex"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(
            model="byte-lm",
            messages=ASK,
            extra_body={"guided_json": "[" * 10_000 + "]" * 10_000},  # type: ignore[arg-type]
        )
    assert bad.value.body["param"] == "response_format"  # type: ignore[index]


def test_the_native_json_family_takes_a_constraint_and_penalties(shim: ShimProcess) -> None:
    import httpx

    body = {
        "model": "byte-lm", "prompt": "x", "seed": 5, "max_tokens": 32, "frequency_penalty": 0.5,
        "constraint": {"json_schema": {"type": "object", "properties": {"n": {"enum": [1, 2]}}}},
    }  # fmt: skip
    answer = httpx.post(f"{shim.url}/v1/generate", json=body, timeout=30).json()
    assert json.loads(answer["text"]).get("n", 1) in (1, 2), answer
    both = {**body, "constraint": {"regex": "a", "choice": ["b"]}}
    refused = httpx.post(f"{shim.url}/v1/generate", json=both, timeout=30)
    assert refused.status_code == 422, refused.text  # the native family's validation status
    hostile = {**body, "constraint": {"regex": "(unclosed"}}
    refused = httpx.post(f"{shim.url}/v1/generate", json=hostile, timeout=30)
    assert refused.status_code == 400 and "constraint.regex" in refused.text, refused.text
