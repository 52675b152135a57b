"""sse.py: event framing, terminal events and heartbeats that never cancel the pending read."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from shim.errors import ErrorBody
from shim.stream import sse

pytestmark = pytest.mark.anyio


def test_token_event_framing() -> None:
    assert sse.token_event("hé", [1, 2]) == 'event: token\ndata: {"text":"hé","token_ids":[1,2]}\n\n'.encode()


def test_text_with_newlines_stays_on_one_data_line() -> None:
    framed = sse.token_event("a\nb\r\n", [])
    assert framed.count(b"\n") == 3
    assert json.loads(framed.split(b"data: ", 1)[1])["text"] == "a\nb\r\n"


def test_done_event_carries_usage_and_optional_error() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    plain = sse.done_event("stop", usage)
    assert (
        plain
        == b'event: done\ndata: {"finish_reason":"stop","usage":'
        + json.dumps(usage, separators=(",", ":")).encode()
        + b"}\n\n"
    )
    failed = sse.done_event("error", usage, ErrorBody(grpc.StatusCode.INTERNAL, "boom", reason="MODEL_ERROR"))
    payload = json.loads(failed.decode().split("data: ", 1)[1])
    assert payload["error"]["code"] == "INTERNAL"
    assert payload["error"]["reason"] == "MODEL_ERROR"


def test_error_event_wraps_the_error_body() -> None:
    framed = sse.error_event(ErrorBody(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry_after_s=1.0))
    event, data = framed.decode().rstrip("\n").split("\n")
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["retry_after_s"] == 1.0


async def test_heartbeats_until_pings_while_waiting_and_leaves_the_future_alone() -> None:
    pending: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    pings = sse.heartbeats_until(pending, interval_s=0.01)
    assert await anext(pings) == sse.PING
    assert await anext(pings) == sse.PING
    assert not pending.cancelled()
    pending.set_result("message")
    with pytest.raises(StopAsyncIteration):
        await anext(pings)
    assert pending.result() == "message"


async def test_heartbeats_until_yields_nothing_for_a_finished_future() -> None:
    pending: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    pending.set_result("now")
    assert [ping async for ping in sse.heartbeats_until(pending, interval_s=10)] == []
