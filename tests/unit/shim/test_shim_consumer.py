"""stream/consumer.py, the one Generate-stream consumer, against the fake server: first messages first, then
every call's pieces to its final one; a call that fails mid-stream ends the events with Failed; collecting;
and every call cancelled however the events end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from conftest import Upstream
from sluice.inference.v1 import inference_pb2 as pb

from shim.config import ShimSettings
from shim.stream.consumer import Failed, Generations, Piece
from shim.stream.paced import HEARTBEAT
from shim.upstream.channel import Upstream as Channel
from shim.upstream.channel import open_upstream

pytestmark = pytest.mark.anyio


@pytest.fixture
async def channel(upstream: Upstream) -> AsyncIterator[Channel]:
    opened = open_upstream(ShimSettings(upstream=upstream.target))
    try:
        yield opened
    finally:
        await opened.close()


def generations(channel: Channel, *models_and_prompts: tuple[str, str]) -> Generations:
    requests = [pb.GenerateRequest(model=model, text=prompt) for model, prompt in models_and_prompts]
    return Generations(channel, requests, timeout_s=10.0, reconnect_s=1.0)


async def test_two_calls_give_their_first_messages_first_then_every_piece(channel: Channel) -> None:
    calls = generations(channel, ("gen", "ab"), ("gen", "xyz"))
    await calls.start()
    events = [event async for event in calls.events(heartbeat_s=10.0)]
    pieces = [event for event in events if isinstance(event, Piece)]
    assert len(pieces) == len(events)
    assert [(p.index, p.text) for p in pieces[:2]] == [(0, "a"), (1, "x")]
    for index, text in ((0, "ab"), (1, "xyz")):
        mine = [p for p in pieces if p.index == index]
        assert "".join(p.text for p in mine) == text
        assert (mine[-1].finish_reason, mine[-1].usage.completion_tokens) == ("length", len(text))
        assert all(p.finish_reason is None for p in mine[:-1])
    assert all(call.done() for call in calls.calls)


async def test_a_call_failing_mid_stream_ends_the_events_and_cancels_the_others(
    channel: Channel, upstream: Upstream
) -> None:
    calls = generations(channel, ("gen-endless", "x"), ("gen-midfail", "x"))
    await calls.start()
    events = [event async for event in calls.events(heartbeat_s=10.0)]
    assert isinstance(events[-1], Failed) and events[-1].index == 1
    assert (events[-1].error.code, events[-1].error.reason) == (grpc.StatusCode.INTERNAL, "MODEL_ERROR")
    assert not any(isinstance(event, Failed) for event in events[:-1])
    await upstream.servicer.generation_cancelled.wait()  # the endless one, cancelled


async def test_a_quiet_call_gets_heartbeats(channel: Channel, upstream: Upstream) -> None:
    calls = generations(channel, ("gen-slow", "x"))
    await calls.start()
    seen = []
    async for event in calls.events(heartbeat_s=0.02):
        seen.append(event)
        if event is HEARTBEAT:
            upstream.servicer.release_slow.set()
    assert HEARTBEAT in seen
    texts = [event.text for event in seen if isinstance(event, Piece)]
    assert texts == ["a", "b"]


async def test_collect_reads_each_call_whole(channel: Channel) -> None:
    calls = generations(channel, ("gen", "ab"), ("gen-error-final", "x"))
    await calls.start()
    first, second = await calls.collect()
    assert (first.text, first.token_ids, first.finish_reason, first.error) == ("ab", [0, 1], "length", None)
    assert (second.text, second.finish_reason) == ("a", "error")
    assert second.error is not None and second.error.reason == "MODEL_ERROR"
