"""The tool-call format and how tools reach the prompt. Calls are written as Hermes' and Qwen2.5's
templates write them, one JSON object per call between tags:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A tokenizer whose chat template takes tools (`apply_chat_template(tools=...)`) gets them in OpenAI's
function form; the default template gets a system turn that lists them and states this format."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from server.domain import ChatTurn
from wire.constraint import Tool, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parameters(tool: Tool) -> dict[str, Any]:
    """The tool's arguments schema (any object when none was given)."""
    if not tool.parameters_json:
        return {"type": "object"}
    value = json.loads(tool.parameters_json)
    return value if isinstance(value, dict) else {"type": "object"}


def openai_functions(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": parameters(t)},
        }
        for t in tools
    ]


def call_text(call: ToolCall) -> str:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = call.arguments
    return f"{OPEN}\n{json.dumps({'name': call.name, 'arguments': arguments})}\n{CLOSE}"


def default_tools_turn(tools: Sequence[Tool]) -> ChatTurn:
    listing = "\n".join(json.dumps(f["function"]) for f in openai_functions(tools))
    return ChatTurn(
        "system",
        "You may call these functions. To call one, write exactly\n"
        f'{OPEN}\n{{"name": <function name>, "arguments": <arguments object>}}\n{CLOSE}\n'
        f"Functions:\n{listing}",
    )


def default_turns(turns: Sequence[ChatTurn], tools: Sequence[Tool]) -> list[ChatTurn]:
    """The conversation for the default template: the tools' system turn first, calls as their text."""
    out = [default_tools_turn(tools)] if tools else []
    for turn in turns:
        content = turn.content
        if turn.tool_calls:
            content = "\n".join([content, *(call_text(c) for c in turn.tool_calls)]).strip("\n")
        out.append(ChatTurn(turn.role, content))
    return out


def hf_messages(turns: Sequence[ChatTurn]) -> list[dict[str, Any]]:
    """The conversation as transformers' chat templates read it (OpenAI's message shape)."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        message: dict[str, Any] = {"role": turn.role, "content": turn.content}
        if turn.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _args(c)}}
                for c in turn.tool_calls
            ]
        if turn.tool_call_id:
            message["tool_call_id"] = turn.tool_call_id
        if turn.name:
            message["name"] = turn.name
        messages.append(message)
    return messages


def _args(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return call.arguments
