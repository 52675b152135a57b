"""POST /v1/chat/completions: the messages go to the server as a chat prompt (the model's own chat template
renders them), n Generate calls make the choices, and the answer is a `chat.completion` or a stream of
`chat.completion.chunk` events (the first of each choice carries the role) ending with `data: [DONE]`."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from clients.messages import build_generate_request
from clients.types import ChatMessage
from shim.identity import current_request_id
from shim.openai.request_models import ChatCompletionRequest
from shim.openai.streaming import choice_events, data_event, token_text, usage_json
from shim.openai.structured import tool_choice_of, tools_of
from shim.stream.consumer import Choice, Generations, Piece
from wire.constraint import ToolCall

# OpenAI's developer role is its newer name for the system prompt.
_ROLES = {"developer": "system"}


def generate_requests(
    body: ChatCompletionRequest, *, request_id: str, priority: Any
) -> list[pb.GenerateRequest]:
    messages = [
        ChatMessage(
            _ROLES.get(m.role, m.role),  # type: ignore[arg-type]
            m.text,
            tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()),
            m.tool_call_id or "",
            m.name or "",
        )
        for m in body.messages
    ]
    tools = tools_of(body.tools)
    constraint = body.constraint()
    return [
        build_generate_request(
            body.model,
            messages,
            sampling=body.to_sampling(choice=i),
            priority=priority,
            request_id=f"{request_id}-{i}" if body.n > 1 else request_id,
            constraint=constraint,
            tools=tools,
            tool_choice=tool_choice_of(body.tool_choice),
            parallel_tool_calls=body.parallel_tool_calls,
        )
        for i in range(body.n)
    ]


def tool_calls_json(calls: Sequence[pb.ToolCall], *, indexed: bool = False) -> list[dict[str, Any]]:
    """OpenAI's tool_calls: in a message, or (indexed) in a stream's delta."""
    out = []
    for index, call in enumerate(calls):
        entry: dict[str, Any] = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        out.append({"index": index, **entry} if indexed else entry)
    return out


def _message(choice: Choice) -> dict[str, Any]:
    if not choice.tool_calls:
        return {"role": "assistant", "content": choice.text}
    return {
        "role": "assistant",
        "content": choice.text or None,
        "tool_calls": tool_calls_json(choice.tool_calls),
    }


def new_id() -> str:
    """As vLLM's: the caller's X-Request-Id where it sent one, under the OpenAI object's prefix."""
    return f"chatcmpl-{current_request_id() or secrets.token_hex(12)}"


def _logprobs(entries: Sequence[pb.TokenLogprob], wanted: bool) -> dict[str, Any] | None:
    if not wanted:
        return None

    def one(p: pb.TokenProbability) -> dict[str, Any]:
        return {"token": token_text(p.token), "logprob": p.logprob, "bytes": list(p.token)}

    return {"content": [{**one(e.chosen), "top_logprobs": [one(t) for t in e.top]} for e in entries]}


def completion(body: ChatCompletionRequest, choices: list[Choice], *, request_id: str) -> dict[str, Any]:
    """The whole answer; a choice that ended with an error makes the whole request fail (raised by caller)."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [
            {
                "index": c.index,
                "message": _message(c),
                "logprobs": _logprobs(c.logprobs, body.logprobs),
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_json({c.index: c.usage for c in choices}, n=body.n),
    }


async def chunks(
    body: ChatCompletionRequest, generations: Generations, *, request_id: str, heartbeat_s: float
) -> AsyncIterator[bytes]:
    """The SSE stream; the caller's response runs `generations.cancel()` however it ends."""
    created = int(time.time())
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": body.model}

    def event(index: int, delta: dict[str, Any], finish: str | None, logprobs: Any = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return data_event({**head, "choices": [choice]})

    for index in range(body.n):
        yield event(index, {"role": "assistant", "content": ""}, None)

    def render(piece: Piece) -> Iterator[bytes]:
        if piece.text or piece.logprobs:
            yield event(piece.index, {"content": piece.text}, None, _logprobs(piece.logprobs, body.logprobs))
        if piece.tool_calls:
            yield event(piece.index, {"tool_calls": tool_calls_json(piece.tool_calls, indexed=True)}, None)
        if piece.finish_reason is not None:
            yield event(piece.index, {}, piece.finish_reason)

    events = choice_events(
        generations, head, render, heartbeat_s=heartbeat_s, n=body.n, include_usage=body.include_usage
    )
    async for chunk in events:
        yield chunk
