"""The `response` object of the Responses API, built from a Generate call's outcome: its output items (a
`message` with one `output_text` part for the text, a `function_call` item per call the model made), its
status (`completed`; `incomplete` with `max_output_tokens` where the limit cut it; `failed` with an error),
the request's settings echoed as OpenAI echoes them, and `usage` with the prefix cache's tokens as
`input_tokens_details.cached_tokens`. Plain dicts: no model per request on the hot path."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from shim.identity import current_request_id
from shim.openai_responses.request_models import FunctionChoice, ResponsesRequest

#: A finish reason -> the response's status and its `incomplete_details`.
_ENDINGS: dict[str, tuple[str, dict[str, str] | None]] = {
    "length": ("incomplete", {"reason": "max_output_tokens"}),
    "stop": ("completed", None),
    "tool_calls": ("completed", None),
}


def new_id(prefix: str) -> str:
    """An object's id under OpenAI's prefix (`resp`, `msg`, `fc`); a response's is the caller's
    X-Request-Id where it sent one, as vLLM's."""
    if prefix == "resp" and (given := current_request_id()) is not None:
        return f"resp_{given}"
    return f"{prefix}_{secrets.token_hex(16)}"


def usage_json(usage: pb.Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},  # no served model has a reasoning mode
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def message_item(item_id: str, text: str, *, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def function_call_item(item_id: str, call: pb.ToolCall, *, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def output_items(text: str, calls: Sequence[pb.ToolCall]) -> list[dict[str, Any]]:
    """The whole output: the text (a message, also when empty and no call was made), then the calls."""
    items = [message_item(new_id("msg"), text, status="completed")] if text or not calls else []
    for call in calls:
        items.append(function_call_item(new_id("fc"), call, arguments=call.arguments, status="completed"))
    return items


def ending(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """The status of a response whose generation ended with `finish_reason`, and its incomplete_details."""
    return _ENDINGS.get(finish_reason or "", ("completed", None))


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What every rendering of one response shares: the request, the response's id and creation time."""

    body: ResponsesRequest
    id: str
    created_at: int

    def response(
        self,
        *,
        status: str,
        output: list[dict[str, Any]],
        usage: pb.Usage | None = None,
        incomplete: dict[str, str] | None = None,
        error: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body = self.body
        choice = body.tool_choice
        text = body.text.model_dump(by_alias=True, exclude_none=True) if body.text is not None else {}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": body.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "store": body.store,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "text": {"format": {"type": "text"}, **text},
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else (choice or "auto"),
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
            "truncation": "disabled",
            "background": False,
            "metadata": body.metadata or {},
            "user": body.user,
            "usage": None if usage is None else usage_json(usage),
        }
