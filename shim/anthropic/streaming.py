"""Anthropic's server-sent events for a streamed message, rendered from the shim's one stream consumer
(shim.stream.consumer): `message_start` (usage not known yet: the server counts the prompt as it starts),
a `ping`, then content blocks (`content_block_start`, its deltas, `content_block_stop`): the text as
`text_delta`s while it comes, then one `tool_use` block per call with its input as one `input_json_delta`
(the server parses calls once the generation ends), then `message_delta` with the stop reason and the whole
usage (the SDKs take the input counts from it), and `message_stop`. A quiet stream gets `ping`s; a failed
call ends it with an `error` event, which the SDKs raise."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from shim.anthropic.errors import anthropic_status, error_json
from shim.anthropic.messages import head, stop_json, tool_use_json, usage_json
from shim.anthropic.request_models import MessagesRequest
from shim.errors import ErrorBody, ShimError
from shim.stream.consumer import Generations, Piece
from shim.stream.paced import Heartbeat
from shim.stream.sse import frame

PING = frame("ping", {"type": "ping"})


def _event(kind: str, **data: Any) -> bytes:
    return frame(kind, {"type": kind, **data})


def error_event(error: ErrorBody) -> bytes:
    return frame("error", error_json(error, anthropic_status(ShimError(error))))


class _Blocks:
    """The content blocks of one message, numbered as they open."""

    def __init__(self) -> None:
        self.index = 0
        self.text_open = False

    def text(self, text: str) -> Iterator[bytes]:
        if not self.text_open:
            yield _event("content_block_start", index=self.index, content_block={"type": "text", "text": ""})
            self.text_open = True
        if text:
            yield _event("content_block_delta", index=self.index, delta={"type": "text_delta", "text": text})

    def close_text(self) -> Iterator[bytes]:
        if self.text_open:
            yield _event("content_block_stop", index=self.index)
            self.index += 1
            self.text_open = False

    def last(self, piece: Piece) -> Iterator[bytes]:
        if not piece.tool_calls and not self.text_open and self.index == 0:
            yield from self.text("")  # an empty answer is one empty text block, as the whole message's
        yield from self.close_text()
        for call in piece.tool_calls:
            yield _event(
                "content_block_start", index=self.index, content_block=tool_use_json(call, whole=False)
            )
            delta = {"type": "input_json_delta", "partial_json": call.arguments or "{}"}
            yield _event("content_block_delta", index=self.index, delta=delta)
            yield _event("content_block_stop", index=self.index)
            self.index += 1


async def events(
    body: MessagesRequest, generations: Generations, *, message_id: str, heartbeat_s: float
) -> AsyncIterator[bytes]:
    """The SSE stream; the caller's response runs `generations.cancel()` however it ends."""
    opening: dict[str, Any] = {"content": [], "stop_reason": None, "stop_sequence": None}
    usage = {"input_tokens": 0, "output_tokens": 0}
    yield _event("message_start", message={**head(body, message_id), **opening, "usage": usage})
    yield PING
    blocks = _Blocks()
    async for item in generations.events(heartbeat_s=heartbeat_s):
        if isinstance(item, Heartbeat):
            yield PING
            continue
        if item.error is not None:  # a failed call, or a generation that ended with an error
            yield error_event(item.error)
            return
        if item.text:
            for event in blocks.text(item.text):
                yield event
        if item.finish_reason is not None:
            for event in blocks.last(item):
                yield event
            delta = stop_json(item.finish_reason, item.stop_sequence)
            yield _event("message_delta", delta=delta, usage=usage_json(item.usage))
            yield _event("message_stop")
