"""Issue 31, item 1 and acceptance 1: OpenAI's Responses API (`POST /v1/responses`) through the official
`openai` SDK, unchanged, against the real shim and server: SmolLM2 answers "What is the capital of France?"
with Paris, streamed and not (the Responses event sequence, numbered), calls a function and answers from its
output (function_call, then function_call_output items), answers in a JSON schema (`responses.parse`);
stored responses continue with `previous_response_id` and can be fetched and deleted; what Sluice cannot
honour is a 400 naming it, in OpenAI's error shape; leaving a stream stops its generation on the server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from shim.openai_responses.response_models import ResponseObject
from tests.support.packages import require
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

require("transformers", "gguf")

QUESTION = "What is the capital of France?"
STORY = "Write a long story about a dragon."
IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--models", "smollm2,byte-lm")
    shim = start_shim(server.target)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


@pytest.fixture
def sdk(stack: tuple[ServerProcess, ShimProcess]) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{stack[1].url}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def test_smollm2_answers_paris_whole_and_streamed_with_the_event_sequence(sdk: openai.OpenAI) -> None:
    whole = sdk.responses.create(model="smollm2", input=QUESTION, temperature=0, max_output_tokens=24)
    ResponseObject.model_validate(whole.model_dump(exclude_unset=True))
    assert whole.status == "completed" and "Paris" in whole.output_text, whole.output_text
    assert whole.usage is not None and whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens

    events = list(
        sdk.responses.create(
            model="smollm2", input=QUESTION, temperature=0, max_output_tokens=24, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ], kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")  # type: ignore[union-attr]
    completed = events[-1].response  # type: ignore[union-attr]
    assert deltas == completed.output_text == whole.output_text  # greedy: the same answer
    # The same prompt again: the prefix cache held it.
    assert completed.usage is not None and completed.usage.input_tokens_details.cached_tokens > 0
    assert completed.usage.input_tokens == whole.usage.input_tokens


def test_smollm2_calls_a_function_then_answers_from_its_output(sdk: openai.OpenAI) -> None:
    """The round trip an agent makes: a function_call item out, then the call and its function_call_output
    item back in; the second answer is text, made from the output."""
    question: list[Any] = [{"role": "user", "content": "What's the weather in Paris?"}]
    called = sdk.responses.create(
        model="smollm2", input=question, tools=[WEATHER], tool_choice="required",  # type: ignore[list-item]
        temperature=0, max_output_tokens=60,
    )  # fmt: skip
    ResponseObject.model_validate(called.model_dump(exclude_unset=True))
    calls = [item for item in called.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]  # type: ignore[union-attr]
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")  # type: ignore[union-attr]
    back = [
        *question,
        *(item.model_dump(exclude_unset=True) for item in called.output),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 degrees and sunny"},  # type: ignore[union-attr]
    ]
    answered = sdk.responses.create(
        model="smollm2", input=back, tools=[WEATHER], tool_choice="none",  # type: ignore[list-item]
        temperature=0, max_output_tokens=40,
    )  # fmt: skip
    assert answered.output[0].type == "message" and "22" in answered.output_text, answered.output_text
    # The call and its output were in the prompt, after the first request's (which the prefix cache held).
    assert called.usage is not None and answered.usage is not None
    assert answered.usage.input_tokens > called.usage.input_tokens + 10
    assert answered.usage.input_tokens_details.cached_tokens > 0


def test_a_streamed_function_call_has_its_argument_events(sdk: openai.OpenAI) -> None:
    events = list(
        sdk.responses.create(
            model="smollm2", input="What's the weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"}, temperature=0, max_output_tokens=60,
            stream=True,
        )
    )  # fmt: skip
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    done = events[4]
    assert json.loads(done.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    item = events[5].item  # type: ignore[union-attr]
    assert item.type == "function_call" and item.name == "get_weather" and item.id == done.item_id  # type: ignore[union-attr]
    assert events[-1].response.output[0].call_id == item.call_id  # type: ignore[union-attr]


class Capital(BaseModel):
    country: str
    capital: str


def test_smollm2_answers_in_the_json_schema_the_sdk_parses(sdk: openai.OpenAI) -> None:
    parsed = sdk.responses.parse(
        model="smollm2",
        input="What is the capital of France? Answer in JSON.",
        text_format=Capital,
        temperature=0,
        max_output_tokens=48,
    )
    assert parsed.status == "completed", parsed
    assert parsed.output_parsed is not None and parsed.output_parsed.capital == "Paris", parsed.output_text
    loose = sdk.responses.create(
        model="smollm2", input="What is the capital of France? Answer in JSON.",
        text={"format": {"type": "json_object"}}, temperature=0, max_output_tokens=48,
    )  # fmt: skip
    assert isinstance(json.loads(loose.output_text), dict), loose.output_text


def test_a_stored_response_continues_with_previous_response_id(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(
        model="smollm2", input="Remember this word: tangerine.", instructions="Be brief.",
        temperature=0, max_output_tokens=16,
    )  # fmt: skip
    assert sdk.responses.retrieve(first.id).output_text == first.output_text
    second = sdk.responses.create(
        model="smollm2", input="Which word did I ask you to remember?", previous_response_id=first.id,
        temperature=0, max_output_tokens=16,
    )  # fmt: skip
    assert second.previous_response_id == first.id and first.usage is not None and second.usage is not None
    # The first turn and its answer came first in the prompt (the instructions did not: OpenAI drops them).
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 8
    assert second.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(openai.NotFoundError) as info:
        sdk.responses.create(model="smollm2", input="Hi", previous_response_id="resp_nope")
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    unkept = sdk.responses.create(model="smollm2", input="Hi", store=False, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unkept.id)
    sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"role": "user", "content": [IMAGE]}]}, "input[0].content[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400_naming_it(
    stack: tuple[ServerProcess, ShimProcess], extra: dict[str, Any], param: str
) -> None:
    body = {"model": "byte-lm", "input": "Hi", **extra}
    answer = httpx.post(f"{stack[1].url}/v1/responses", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, error


def test_the_sdk_raises_its_own_errors(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="no-such-model", input="Hi")
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="byte-lm", input="Hi", background=True)
    assert info.value.body["param"] == "background"  # type: ignore[index]


def test_leaving_a_stream_stops_generation_on_the_server(
    stack: tuple[ServerProcess, ShimProcess], sdk: openai.OpenAI
) -> None:
    server = stack[0]
    before = server.metric("sluice_tokens_generated_total", model="smollm2")
    # Greedy, SmolLM2 writes this story to any max_output_tokens (900 measured).
    stream = sdk.responses.create(
        model="smollm2", input=STORY, max_output_tokens=900, stream=True, temperature=0
    )
    with stream:
        for event in stream:
            if event.type == "response.output_text.delta" and event.sequence_number == 8:
                break
    wait_until(
        lambda: server.metric("sluice_sequences_active", model="smollm2") == 0, what="the sequence gone"
    )
    generated = server.metric("sluice_tokens_generated_total", model="smollm2") - before
    assert generated < 300, generated  # far from 900: the stop reached the server within a few steps


def test_an_answer_cut_by_max_output_tokens_is_incomplete(sdk: openai.OpenAI) -> None:
    asked: dict[str, Any] = {"model": "smollm2", "input": "Count from one to fifty.", "temperature": 0}
    cut = sdk.responses.create(**asked, max_output_tokens=5)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert cut.usage is not None and cut.usage.output_tokens == 5
    events = list(sdk.responses.create(**asked, max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == cut.output_text  # type: ignore[union-attr]
