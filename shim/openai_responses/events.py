"""The Responses API's server-sent events, from the shim's one stream consumer (shim.stream.consumer): each
a named event (`event: response.output_text.delta`) whose data carries its `type` and a `sequence_number`
counting from 0, in OpenAI's order:

    response.created, response.in_progress
    for the text:  response.output_item.added (a message), response.content_part.added (output_text),
                   response.output_text.delta per piece, response.output_text.done,
                   response.content_part.done, response.output_item.done
    per call:      response.output_item.added (a function_call), response.function_call_arguments.delta,
                   response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete where max_output_tokens cut it)

`: ping` comments keep a quiet stream open; a generation that fails midway ends with an `error` event and
`response.failed`. The calls come whole with the final message (the server parses them at the end), so a
call's arguments are one delta."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from shim.errors import ErrorBody, ShimError
from shim.openai_errors import openai_error_json
from shim.openai_responses.answer import ResponseHead, ending, function_call_item, message_item, new_id
from shim.stream.consumer import Generations, Piece
from shim.stream.paced import Heartbeat
from shim.stream.sse import PING, frame

#: Called with the finished response object, its text, its calls and the server's timings (to store it, to
#: note its usage in the span and the access log).
Finished = Callable[[dict[str, Any], str, Sequence[pb.ToolCall], pb.GenerateTimings], None]
_PART = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}


class _Numbered:
    """Frames events with their type and the stream's next sequence number."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        number, self.next = self.next, self.next + 1
        return frame(kind, {"type": kind, "sequence_number": number, **fields})


def _failure(head: ResponseHead, event: _Numbered, error: ErrorBody, output: list[Any]) -> list[bytes]:
    shaped = openai_error_json(ShimError(error))["error"]
    status = ShimError(error).status
    code = "rate_limit_exceeded" if status == 429 else ("invalid_prompt" if status < 500 else "server_error")
    failed = head.response(status="failed", output=output, error={"code": code, "message": shaped["message"]})
    return [
        event("error", code=shaped["code"], message=shaped["message"], param=shaped["param"]),
        event("response.failed", response=failed),
    ]


def _calls(event: _Numbered, calls: Sequence[pb.ToolCall], output: list[dict[str, Any]]) -> list[bytes]:
    frames = []
    for call in calls:
        index, item_id = len(output), new_id("fc")
        opened = function_call_item(item_id, call, arguments="", status="in_progress")
        done = function_call_item(item_id, call, arguments=call.arguments, status="completed")
        where = {"item_id": item_id, "output_index": index}
        frames += [
            event("response.output_item.added", output_index=index, item=opened),
            event("response.function_call_arguments.delta", **where, delta=call.arguments),
            event("response.function_call_arguments.done", **where, arguments=call.arguments),
            event("response.output_item.done", output_index=index, item=done),
        ]
        output.append(done)
    return frames


async def response_events(
    head: ResponseHead, generations: Generations, *, heartbeat_s: float, finished: Finished
) -> AsyncIterator[bytes]:
    """The SSE stream of one response; the caller's response runs `generations.cancel()` however it ends."""
    event = _Numbered()
    yield event("response.created", response=head.response(status="in_progress", output=[]))
    yield event("response.in_progress", response=head.response(status="in_progress", output=[]))
    output: list[dict[str, Any]] = []
    message_id: str | None = None
    texts: list[str] = []

    def opening() -> list[bytes]:
        nonlocal message_id
        message_id = new_id("msg")
        where = {"item_id": message_id, "output_index": 0, "content_index": 0}
        item = message_item(message_id, "", status="in_progress")
        return [
            event("response.output_item.added", output_index=0, item=item),
            event("response.content_part.added", **where, part=_PART),
        ]

    async for item in generations.events(heartbeat_s=heartbeat_s):
        if isinstance(item, Heartbeat):
            yield PING
            continue
        if item.error is not None:  # a call that failed (Failed), or a generation that ended with an error
            for failure in _failure(head, event, item.error, output):
                yield failure
            return
        if not isinstance(item, Piece):  # pragma: no cover - a Failed always carries its error
            continue
        piece = item
        if piece.text or (piece.finish_reason is not None and message_id is None and not piece.tool_calls):
            for opened in opening() if message_id is None else []:
                yield opened
            texts.append(piece.text)
            if piece.text:
                where = {"item_id": message_id, "output_index": 0, "content_index": 0}
                yield event("response.output_text.delta", **where, delta=piece.text, logprobs=[])
        if piece.finish_reason is None:
            continue
        status, incomplete = ending(piece.finish_reason)
        text = "".join(texts)
        if message_id is not None:
            where = {"item_id": message_id, "output_index": 0, "content_index": 0}
            done = message_item(message_id, text, status="incomplete" if incomplete else "completed")
            yield event("response.output_text.done", **where, text=text, logprobs=[])
            yield event("response.content_part.done", **where, part=done["content"][0])
            yield event("response.output_item.done", output_index=0, item=done)
            output.append(done)
        for frame_ in _calls(event, piece.tool_calls, output):
            yield frame_
        response = head.response(status=status, output=output, usage=piece.usage, incomplete=incomplete)
        finished(response, text, piece.tool_calls, piece.timings)
        yield event(f"response.{status}", response=response)
        return
