"""The Responses family's request side without a server: the body's sampling settings through the one
sampling definition, input items as chat turns (a call joins the assistant turn before it; its output names
the function), instructions only for this request, text.format and tools as the Generate request's
constraint and tools, and refusals naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sluice.inference.v1 import inference_pb2 as pb

from clients.types import ChatMessage
from shim.errors import ShimError
from shim.openai_responses import conversation
from shim.openai_responses.refusals import parse
from shim.openai_responses.request_models import ResponsesRequest
from wire.constraint import ToolCall
from wire.sampling import Sampling

OUTPUT = {"type": "function_call_output", "call_id": "c"}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def body(**fields: Any) -> ResponsesRequest:
    return parse(json.dumps({"model": "m", "input": "hi", **fields}).encode(), ResponsesRequest)


def test_sampling_goes_through_the_one_definition() -> None:
    asked = body(temperature=0.5, top_p=0.9, max_output_tokens=7).to_sampling()
    assert asked == Sampling(temperature=0.5, top_p=0.9, max_tokens=7)
    assert body().to_sampling() == Sampling()


def test_input_items_become_chat_turns() -> None:
    items = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "weather in "}, {"type": "input_text", "text": "Oslo?"}]},  # noqa: E501
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "-3 and snow"},
    ]  # fmt: skip
    turns = conversation.turns(body(input=items, tools=[TOOL]), (ChatMessage("user", "earlier"),))
    assert turns == (
        ChatMessage("user", "earlier"),
        ChatMessage("system", "be brief"),
        ChatMessage("user", "weather in Oslo?"),
        ChatMessage("assistant", "Checking.", (ToolCall("call_1", "get_weather", '{"city":"Oslo"}'),)),
        ChatMessage("tool", "-3 and snow", tool_call_id="call_1", name="get_weather"),
    )


def test_the_generate_request_has_the_instructions_tools_and_format() -> None:
    asked = body(
        instructions="Answer in JSON.",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
    )
    request = conversation.generate_request(
        asked, conversation.turns(asked), request_id="resp_1", priority=None
    )
    assert [(m.role, m.content) for m in request.chat.messages] == [
        ("system", "Answer in JSON."),
        ("user", "hi"),
    ]
    assert [t.name for t in request.tools] == ["get_weather"] and request.tools[0].strict  # the API's default
    assert request.tool_choice.function == "get_weather"
    assert json.loads(request.constraint.json_schema) == {"type": "object"}
    assert request.request_id == "resp_1" and isinstance(request, pb.GenerateRequest)


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, 400, "tools[0].type"),
        ({"input": [{**OUTPUT, "output": [{"type": "input_file"}]}]}, 400, "input[0].output[0].type"),
        ({"input": [{**OUTPUT, "output": [{"type": "input_text"}]}]}, 400, "input[0].output[0].text"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, 400, "tool_choice"),
        ({"text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
        ({"truncation": "auto"}, 400, "truncation"),
        ({"input": []}, 400, "input"),
        ({"temperature": 2.5}, 400, "temperature"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(fields: dict[str, Any], status: int, param: str | None) -> None:
    with pytest.raises(ShimError) as info:
        body(**fields)
    assert info.value.status == status, info.value.body
    if param is not None:
        assert info.value.body.field_violations[0].field == param
