"""/v1/generate: collected JSON, SSE relay, errors before and after the first token, heartbeats,
client disconnects cancelling the upstream call, and the in-flight bound."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from conftest import RunningShim, ShimFactory, Upstream

pytestmark = pytest.mark.anyio


@dataclass
class Event:
    name: str | None
    data: Any


async def sse_items(response: httpx.Response) -> AsyncIterator[Event]:
    """Parses the stream; a `: ping` comment is reported as Event(name="ping")."""
    name: str | None = None
    async for line in response.aiter_lines():
        if line == ": ping":
            yield Event("ping", None)
        elif line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield Event(name, json.loads(line.removeprefix("data: ")))
            name = None


async def test_non_streaming_collects_the_whole_generation(shim: RunningShim, upstream: Upstream) -> None:
    response = await shim.client.post(
        "/v1/generate", json={"model": "gen", "prompt": "hello", "max_tokens": 3, "seed": 7}
    )
    assert response.status_code == 200
    body = response.json()
    assert body.pop("timings")["queue_time_ms"] == 0.0  # this fake upstream sends no timings
    assert body == {
        "text": "hel",
        "token_ids": [0, 1, 2],
        "finish_reason": "length",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "cached_tokens": 0},
    }
    sent = upstream.servicer.generate_requests[-1]
    assert sent.sampling.max_tokens == 3
    assert sent.sampling.seed == 7


async def test_non_streaming_final_error_is_reported(shim: RunningShim) -> None:
    response = await shim.client.post("/v1/generate", json={"model": "gen-error-final", "prompt": "x"})
    assert response.status_code == 200
    body = response.json()
    assert body["finish_reason"] == "error"
    assert body["text"] == "a"
    assert body["error"]["code"] == "INTERNAL"
    assert body["error"]["reason"] == "MODEL_ERROR"


async def test_stream_relays_tokens_then_done(shim: RunningShim) -> None:
    async with shim.client.stream(
        "POST", "/v1/generate", json={"model": "gen", "prompt": "abc", "stream": True}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        events = [event async for event in sse_items(response)]
    assert events[-1].data.pop("timings")["tokens_per_second"] == 0.0  # this fake upstream sends none
    assert [(e.name, e.data) for e in events] == [
        ("token", {"text": "a", "token_ids": [0]}),
        ("token", {"text": "b", "token_ids": [1]}),
        ("token", {"text": "c", "token_ids": [2]}),
        (
            "done",
            {
                "finish_reason": "length",
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6, "cached_tokens": 0},
            },
        ),
    ]


async def test_error_before_the_first_token_is_a_plain_http_error(shim: RunningShim) -> None:
    async with shim.client.stream(
        "POST", "/v1/generate", json={"model": "gen-busy", "prompt": "x", "stream": True}
    ) as response:
        await response.aread()
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["reason"] == "QUEUE_FULL"


async def test_sampling_field_violation_names_the_json_field(shim: RunningShim) -> None:
    response = await shim.client.post(
        "/v1/generate", json={"model": "gen-bad-temperature", "prompt": "x", "temperature": -1.0}
    )
    assert response.status_code == 400
    assert response.json()["error"]["field_violations"] == [
        {"field": "temperature", "description": "must be >= 0", "proto_field": "sampling.temperature"}
    ]


async def test_status_error_mid_stream_ends_with_an_error_event(shim: RunningShim) -> None:
    async with shim.client.stream(
        "POST", "/v1/generate", json={"model": "gen-midfail", "prompt": "x", "stream": True}
    ) as response:
        events = [event async for event in sse_items(response)]
    assert [e.name for e in events] == ["token", "error"]
    assert events[1].data["error"]["code"] == "INTERNAL"
    assert events[1].data["error"]["reason"] == "MODEL_ERROR"


async def test_final_error_message_ends_with_done_carrying_the_error(shim: RunningShim) -> None:
    async with shim.client.stream(
        "POST", "/v1/generate", json={"model": "gen-error-final", "prompt": "x", "stream": True}
    ) as response:
        events = [event async for event in sse_items(response)]
    assert [e.name for e in events] == ["token", "done"]
    assert events[1].data["finish_reason"] == "error"
    assert events[1].data["error"]["reason"] == "MODEL_ERROR"


async def test_generate_is_never_retried(shim: RunningShim, upstream: Upstream) -> None:
    response = await shim.client.post("/v1/generate", json={"model": "gen-unavailable", "prompt": "x"})
    assert response.status_code == 503
    assert upstream.servicer.generate_attempts == 1


async def test_exactly_one_prompt_is_required(shim: RunningShim) -> None:
    response = await shim.client.post(
        "/v1/generate", json={"model": "gen", "prompt": "x", "prompt_token_ids": [1]}
    )
    assert response.status_code == 422
    assert response.json()["error"]["field_violations"][0]["field"] == "$"


async def test_heartbeats_fill_a_quiet_stream(start_shim: ShimFactory, upstream: Upstream) -> None:
    shim = await start_shim(sse_heartbeat_s=0.05)
    seen: list[str | None] = []
    with anyio.fail_after(10):
        async with shim.client.stream(
            "POST", "/v1/generate", json={"model": "gen-slow", "prompt": "x", "stream": True}
        ) as response:
            async for event in sse_items(response):
                seen.append(event.name)
                if event.name == "ping" and seen.count("ping") == 2:
                    upstream.servicer.release_slow.set()
    assert seen[0] == "token"
    assert seen[-2:] == ["token", "done"]
    assert seen.count("ping") >= 2


async def test_client_disconnect_cancels_the_upstream_call_and_frees_the_slot(
    shim: RunningShim, upstream: Upstream
) -> None:
    with anyio.fail_after(10):
        async with shim.client.stream(
            "POST", "/v1/generate", json={"model": "gen-endless", "prompt": "x", "stream": True}
        ) as response:
            async for event in sse_items(response):
                assert event.name == "token"
                break
        await upstream.servicer.generation_cancelled.wait()
        await shim.app.state.inflight.wait_idle()
    assert shim.app.state.inflight.inflight == 0


async def test_inflight_bound_refuses_before_reading_the_body(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    shim = await start_shim(max_inflight=1)
    with anyio.fail_after(10):
        async with shim.client.stream(
            "POST", "/v1/generate", json={"model": "gen-slow", "prompt": "x", "stream": True}
        ) as held:
            items = sse_items(held)
            assert (await anext(items)).name == "token"
            refused = await shim.client.post("/v1/infer", content=b"not even json")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["reason"] == "SHIM_OVERLOADED"
            assert (await shim.client.get("/healthz")).status_code == 200
            upstream.servicer.release_slow.set()
            assert [event.name async for event in items] == ["token", "done"]
        await shim.app.state.inflight.wait_idle()
        accepted = await shim.client.post("/v1/generate", json={"model": "gen", "prompt": "ok"})
    assert accepted.status_code == 200


async def test_heartbeats_fill_a_quiet_openai_chat_stream(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    shim = await start_shim(sse_heartbeat_s=0.05)
    lines: list[str] = []
    body = {"model": "gen-slow", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with anyio.fail_after(10):
        async with shim.client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
                if lines.count(": ping") == 2:
                    upstream.servicer.release_slow.set()
    assert lines[-1] == "data: [DONE]"
    assert lines.count(": ping") >= 2
    assert lines.index(": ping") > 1  # after the role chunk and the first token
