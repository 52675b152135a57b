"""How /v1/generate answers, rendered from the shim's one stream consumer (shim.stream.consumer): the
collected JSON, or server-sent events, `token` per message with output, then exactly one `done` (with the
error the generation ended with, if any) or `error` (the call failed), and `: ping` on a quiet stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from shim.errors import ErrorBody
from shim.native.translate import usage_to_json
from shim.request_metrics import request_metrics
from shim.stream.consumer import Choice, Failed, Generations, Piece
from shim.stream.sse import PING, frame


def token_event(text: str, token_ids: list[int]) -> bytes:
    return frame("token", {"text": text, "token_ids": token_ids})


def done_event(
    finish_reason: str,
    usage: dict[str, int],
    error: ErrorBody | None = None,
    timings: dict[str, float] | None = None,
) -> bytes:
    data: dict[str, Any] = {"finish_reason": finish_reason, "usage": usage}
    if timings is not None:
        data["timings"] = timings
    if error is not None:
        data["error"] = error.to_json()
    return frame("done", data)


def error_event(error: ErrorBody) -> bytes:
    return frame("error", {"error": error.to_json()})


def answer(choice: Choice, *, model: str) -> dict[str, Any]:
    """The non-streaming answer: the generation whole, its timings, and the error it ended with, if any."""
    usage = usage_to_json(choice.usage)
    body: dict[str, Any] = {
        "text": choice.text,
        "token_ids": choice.token_ids,
        "finish_reason": choice.finish_reason,
        "usage": usage,
        "timings": request_metrics(usage, [choice.timings], model=model),
    }
    if choice.error is not None:
        body["error"] = choice.error.to_json()
    return body


async def events(generations: Generations, *, heartbeat_s: float, model: str) -> AsyncIterator[bytes]:
    """The SSE stream of the one call; the consumer cancels it however the stream ends."""
    async for event in generations.events(heartbeat_s=heartbeat_s):
        if isinstance(event, Piece):
            if event.text or event.token_ids:
                yield token_event(event.text, list(event.token_ids))
            if event.finish_reason is not None:
                usage = usage_to_json(event.usage)
                timings = request_metrics(usage, [event.timings], model=model)
                yield done_event(event.finish_reason, usage, event.error, timings)
        elif isinstance(event, Failed):
            yield error_event(event.error)
        else:
            yield PING
