"""The native family's server-sent events (shim/native/generation.py, framed by shim/stream/sse.py): token
events, and the terminal done and error events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc

from shim.errors import ErrorBody
from shim.native import generation
from shim.stream.sse import EventStreamResponse


def test_token_event_framing() -> None:
    assert (
        generation.token_event("hé", [1, 2])
        == 'event: token\ndata: {"text":"hé","token_ids":[1,2]}\n\n'.encode()
    )


def test_text_with_newlines_stays_on_one_data_line() -> None:
    framed = generation.token_event("a\nb\r\n", [])
    assert framed.count(b"\n") == 3
    assert json.loads(framed.split(b"data: ", 1)[1])["text"] == "a\nb\r\n"


def test_done_event_carries_usage_and_optional_error() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    plain = generation.done_event("stop", usage)
    assert (
        plain
        == b'event: done\ndata: {"finish_reason":"stop","usage":'
        + json.dumps(usage, separators=(",", ":")).encode()
        + b"}\n\n"
    )
    failed = generation.done_event(
        "error", usage, ErrorBody(grpc.StatusCode.INTERNAL, "boom", reason="MODEL_ERROR")
    )
    payload = json.loads(failed.decode().split("data: ", 1)[1])
    assert payload["error"]["code"] == "INTERNAL"
    assert payload["error"]["reason"] == "MODEL_ERROR"


def test_error_event_wraps_the_error_body() -> None:
    framed = generation.error_event(ErrorBody(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry_after_s=1.0))
    event, data = framed.decode().rstrip("\n").split("\n")
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["retry_after_s"] == 1.0


async def _none() -> AsyncIterator[bytes]:
    yield b""


def test_a_family_may_stream_another_media_type_with_the_same_headers() -> None:
    """Ollama's stream is newline-delimited JSON: the family names its media type; the unbuffered headers and
    the close hook are the same."""
    sse = EventStreamResponse(_none(), on_close=lambda: None)
    ndjson = EventStreamResponse(_none(), on_close=lambda: None, media_type="application/x-ndjson")
    assert sse.headers["content-type"].startswith("text/event-stream")
    assert ndjson.headers["content-type"] == "application/x-ndjson"
    assert ndjson.headers["x-accel-buffering"] == sse.headers["x-accel-buffering"] == "no"
