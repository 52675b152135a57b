"""Anthropic's Messages in and out of the Generate contract: the conversation as the server's chat prompt
(`system` first; an assistant's `tool_use` blocks as its tool calls; each `tool_result` as a tool turn
naming the call it answers, before the user's text), the tools and tool_choice as the OpenAI family passes
them (wire.constraint), and the answer as a `message`: a text block, then a `tool_use` block per call, the
stop reason and the usage, in which `cache_read_input_tokens` are the prompt tokens the server's prefix
cache held and `input_tokens` the rest, as Anthropic counts them."""

from __future__ import annotations

import json
import secrets
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from clients.messages import build_generate_request
from clients.types import ChatMessage, PriorityName
from shim.anthropic.request_models import (
    Conversation,
    MessagesRequest,
    TextBlock,
    ToolChoiceParam,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
)
from shim.identity import current_request_id
from shim.stream.consumer import Choice
from wire.constraint import Tool, ToolCall, ToolChoice

# The server's finish reasons as Anthropic's stop reasons; a "stop" that one of the request's stop sequences
# caused (the server names it) is stop_sequence.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_MODES = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}


def new_id() -> str:
    """As vLLM's: the caller's X-Request-Id where it sent one, under the Message object's prefix."""
    return f"msg_{current_request_id() or secrets.token_hex(12)}"


def chat_messages(body: Conversation) -> list[ChatMessage]:
    turns = [ChatMessage("system", body.system_text)] if body.system_text else []
    called: dict[str, str] = {}  # tool_use id -> the function's name, for the tool turn that answers it
    for message in body.messages:
        if isinstance(message.content, str):
            turns.append(ChatMessage(message.role, message.content))
            continue
        texts = [block.text for block in message.content if isinstance(block, TextBlock)]
        if message.role == "assistant":
            calls = tuple(
                ToolCall(block.id, block.name, json.dumps(block.input))
                for block in message.content
                if isinstance(block, ToolUseBlock)
            )
            called.update((call.id, call.name) for call in calls)
            turns.append(ChatMessage("assistant", "".join(texts), calls))
            continue
        results = [block for block in message.content if isinstance(block, ToolResultBlock)]
        for result in results:
            name = called.get(result.tool_use_id, "")
            turns.append(ChatMessage("tool", result.text, (), result.tool_use_id, name))
        if texts or not results:
            turns.append(ChatMessage("user", "".join(texts)))
    return turns


def tools_of(tools: list[ToolDef] | None) -> tuple[Tool, ...]:
    return tuple(
        Tool(t.name, t.description or "", json.dumps(t.input_schema), strict=bool(t.strict))
        for t in tools or ()
    )


def tool_choice_of(choice: ToolChoiceParam | None) -> ToolChoice | None:
    if choice is None:
        return None
    return ToolChoice(_MODES[choice.type], choice.name)  # type: ignore[arg-type]


def prompt_request(body: Conversation) -> pb.GenerateRequest:
    """The conversation and tools alone, as a Generate carries them (count_tokens copies them out)."""
    return build_generate_request(body.model, chat_messages(body), tools=tools_of(body.tools))


def generate_request(
    body: MessagesRequest, *, request_id: str, priority: PriorityName | None
) -> pb.GenerateRequest:
    choice = body.tool_choice
    parallel = None
    if choice is not None and choice.disable_parallel_tool_use is not None:
        parallel = not choice.disable_parallel_tool_use
    return build_generate_request(
        body.model,
        chat_messages(body),
        sampling=body.to_sampling(),
        priority=priority,
        request_id=request_id,
        tools=tools_of(body.tools),
        tool_choice=tool_choice_of(choice),
        parallel_tool_calls=parallel,
    )


def usage_json(usage: pb.Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object; the server's calls carry a JSON object."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_use_json(call: pb.ToolCall, *, whole: bool = True) -> dict[str, Any]:
    """A tool_use block; a stream's opens with an empty input, which its input_json_delta fills."""
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": tool_input(call.arguments) if whole else {},
    }


def stop_json(finish_reason: str, stop_sequence: str) -> dict[str, Any]:
    """`stop_reason` and `stop_sequence`, as a message and a stream's message_delta carry them."""
    if finish_reason == "stop" and stop_sequence:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop_sequence}
    return {"stop_reason": STOP_REASONS.get(finish_reason, "end_turn"), "stop_sequence": None}


def head(body: MessagesRequest, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": body.model}


def message_json(body: MessagesRequest, choice: Choice, *, message_id: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if choice.text or not choice.tool_calls:
        content.append({"type": "text", "text": choice.text})
    content.extend(tool_use_json(call) for call in choice.tool_calls)
    return {
        **head(body, message_id),
        "content": content,
        **stop_json(choice.finish_reason, choice.stop_sequence),
        "usage": usage_json(choice.usage),
    }
