"""A Responses request as a Generate call: the earlier turns (a stored response's conversation, where
`previous_response_id` names one), the input items as chat messages (the model's own chat template renders
them, as for chat completions), `instructions` as the first system turn of this request only (OpenAI does
not carry them over to a later response), the function tools and tool choice, the `text.format` constraint,
and the sampling settings through wire.sampling."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from clients.messages import build_generate_request
from clients.types import ChatMessage
from shim.openai_responses.request_models import (
    FunctionCall,
    FunctionCallOutput,
    FunctionChoice,
    Message,
    ResponsesRequest,
    TextFormat,
)
from wire.constraint import Constraint, Tool, ToolCall, ToolChoice

# The Responses API's developer role is its newer name for the system prompt.
_ROLES = {"developer": "system"}
Conversation = tuple[ChatMessage, ...]


def turns(body: ResponsesRequest, earlier: Conversation = ()) -> Conversation:
    """The conversation so far, without this request's instructions: `earlier` turns, then the input.
    A function_call item joins the assistant turn before it (the model's text and its calls are one turn
    in a chat template), a function_call_output item is a tool turn naming the function it answers."""
    if isinstance(body.input, str):
        return (*earlier, ChatMessage("user", body.input))
    messages = list(earlier)
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    for item in body.input:
        if isinstance(item, Message):
            role: Any = _ROLES.get(item.role, item.role)
            messages.append(ChatMessage(role, item.text))
        elif isinstance(item, FunctionCall):
            call = ToolCall(item.call_id, item.name, item.arguments)
            names[item.call_id] = item.name
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, call))
            else:
                messages.append(ChatMessage("assistant", "", (call,)))
        elif isinstance(item, FunctionCallOutput):
            name = names.get(item.call_id, "")
            messages.append(ChatMessage("tool", item.text, tool_call_id=item.call_id, name=name))
    return tuple(messages)


def answered(conversation: Conversation, text: str, calls: Sequence[pb.ToolCall]) -> Conversation:
    """The conversation with the model's answer appended: what a later `previous_response_id` continues."""
    made = tuple(ToolCall(c.id, c.name, c.arguments) for c in calls)
    return (*conversation, ChatMessage("assistant", text, made))


def constraint_of(shape: TextFormat | None) -> Constraint | None:
    if shape is None or shape.type == "text":
        return None
    if shape.type == "json_object":
        return Constraint.json_object()
    schema = shape.schema_ if shape.schema_ is not None else {"type": "object"}
    # strict is OpenAI's guarantee: what cannot be enforced is refused; without it every keyword that can
    # be enforced still is, as on the chat route.
    return Constraint.json_schema(json.dumps(schema), lenient=not shape.strict)


def _tools(body: ResponsesRequest) -> tuple[Tool, ...]:
    # A function tool is strict unless it says otherwise: the Responses API's default (chat's is false).
    return tuple(
        Tool(
            t.name,
            t.description or "",
            json.dumps(t.parameters) if t.parameters is not None else "",
            strict=t.strict is not False,
        )
        for t in body.tools or ()
    )


def _tool_choice(body: ResponsesRequest) -> ToolChoice | None:
    choice = body.tool_choice
    if choice is None:
        return None
    if isinstance(choice, FunctionChoice):
        return ToolChoice("required", choice.name)
    return ToolChoice(choice)


def generate_request(
    body: ResponsesRequest, conversation: Conversation, *, request_id: str, priority: Any
) -> pb.GenerateRequest:
    """The one Generate call that answers `body` (the Responses API has no `n`)."""
    system = (ChatMessage("system", body.instructions),) if body.instructions else ()
    return build_generate_request(
        body.model,
        [*system, *conversation],
        sampling=body.to_sampling(),
        priority=priority,
        request_id=request_id,
        constraint=constraint_of(body.text.format if body.text is not None else None),
        tools=_tools(body),
        tool_choice=_tool_choice(body),
        parallel_tool_calls=body.parallel_tool_calls,
    )
