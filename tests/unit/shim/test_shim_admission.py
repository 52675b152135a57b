"""admission.py: a slot is refused at once when the bound is full but taken only once the body is in, so
slow bodies hold none; the body's media type (415), deadline (408) and size (413) are checked before
routing; /readyz reports a full bound."""

from __future__ import annotations

import json

import anyio
import pytest
from conftest import RunningShim, ShimFactory, Upstream, eventually
from raw_http import RawConnections, read_response, read_until_closed, request_head
from test_shim_routes_generate import sse_items

pytestmark = pytest.mark.anyio

ECHO = {"model": "echo", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [1]}]}
ECHO_BYTES = json.dumps(ECHO).encode()
JSON_HEADERS = {"Content-Type": "application/json", "Content-Length": str(len(ECHO_BYTES))}


async def test_slow_bodies_hold_no_slot(
    start_shim: ShimFactory, upstream: Upstream, raw: RawConnections
) -> None:
    shim = await start_shim(max_inflight=2, body_timeout_s=30)
    slow = []
    for _ in range(5):  # more senders than slots, each with its headers in and its body half sent
        reader, writer = await raw.open(shim.port)
        writer.write(request_head("POST", "/v1/infer", headers=JSON_HEADERS) + ECHO_BYTES[:10])
        slow.append((reader, writer))
    await eventually(lambda: shim.pool.held == 5, "five connections held")
    assert shim.app.state.inflight.inflight == 0
    response = await shim.client.post("/v1/infer", json=ECHO)
    assert response.status_code == 200
    assert (await shim.client.get("/readyz")).status_code == 200
    # A sender that finishes its body is then served like anyone else.
    reader, writer = slow[0]
    writer.write(ECHO_BYTES[10:])
    assert (await read_response(reader)).status == 200
    for _, slow_writer in slow:
        slow_writer.close()
    assert upstream.servicer.infer_attempts == 2


async def test_a_body_not_in_by_the_deadline_is_408_and_the_connection_closes(
    start_shim: ShimFactory, upstream: Upstream, raw: RawConnections
) -> None:
    shim = await start_shim(body_timeout_s=0.3)
    reader, writer = await raw.open(shim.port)
    writer.write(request_head("POST", "/v1/generate", headers=JSON_HEADERS) + ECHO_BYTES[:10])
    response = await read_response(reader)
    assert response.status == 408
    assert response.headers["connection"] == "close"
    error = response.json()["error"]
    assert (error["code"], error["reason"], error["metadata"]) == (
        "DEADLINE_EXCEEDED",
        "REQUEST_TIMEOUT",
        {"timeout_s": "0.3"},
    )
    assert await read_until_closed(reader) == b""
    writer.close()
    assert shim.app.state.inflight.inflight == 0
    assert upstream.servicer.generate_attempts == 0


async def test_a_client_that_leaves_mid_body_leaves_nothing_behind(
    start_shim: ShimFactory, upstream: Upstream, raw: RawConnections
) -> None:
    shim = await start_shim()
    _, writer = await raw.open(shim.port)
    writer.write(request_head("POST", "/v1/infer", headers=JSON_HEADERS) + ECHO_BYTES[:10])
    await eventually(lambda: shim.pool.held == 1, "the connection held")
    writer.close()
    await eventually(lambda: shim.pool.held == 0, "the connection released")
    assert shim.app.state.inflight.inflight == 0
    assert upstream.servicer.infer_attempts == 0


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"]
)
async def test_a_body_that_is_not_declared_json_is_415_before_it_is_read(
    shim: RunningShim, upstream: Upstream, content_type: str | None, raw: RawConnections
) -> None:
    headers = {"Content-Length": "100000"}  # announced, never sent: the refusal must not wait for it
    if content_type is not None:
        headers["Content-Type"] = content_type
    reader, writer = await raw.open(shim.port)
    writer.write(request_head("POST", "/v1/generate", headers=headers))
    response = await read_response(reader)
    assert response.status == 415
    error = response.json()["error"]
    assert error["reason"] == "UNSUPPORTED_MEDIA_TYPE"
    assert error["field_violations"][0]["field"] == "Content-Type"
    writer.close()
    assert upstream.servicer.generate_attempts == 0


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON; charset=utf-8", "application/vnd.sluice+json"]
)
async def test_json_media_types_with_parameters_or_a_json_suffix_are_accepted(
    shim: RunningShim, content_type: str
) -> None:
    response = await shim.client.post("/v1/infer", content=ECHO_BYTES, headers={"Content-Type": content_type})
    assert response.status_code == 200


async def test_a_declared_length_over_the_limit_is_413_before_the_body(
    start_shim: ShimFactory, raw: RawConnections
) -> None:
    shim = await start_shim(max_body_bytes=100)
    reader, writer = await raw.open(shim.port)
    headers = {"Content-Type": "application/json", "Content-Length": "1" + "0" * 12}
    writer.write(request_head("POST", "/v1/infer", headers=headers))
    response = await read_response(reader)
    assert response.status == 413
    assert response.json()["error"]["reason"] == "REQUEST_TOO_LARGE"
    writer.close()


@pytest.mark.parametrize("declared", ["-1", "+5", "1_0", "ten", "\uff15"])  # the last: a full-width digit
async def test_a_content_length_that_is_not_digits_is_refused_in_the_error_shape(
    shim: RunningShim, declared: str, raw: RawConnections
) -> None:
    reader, writer = await raw.open(shim.port)
    headers = {"Content-Type": "application/json", "Content-Length": declared}
    writer.write(request_head("POST", "/v1/infer", headers=headers))
    response = await read_response(reader)
    assert response.status == 400
    assert response.json()["error"]["reason"] in ("INVALID_HEADER", "MALFORMED_HTTP")
    writer.close()


async def test_readyz_is_503_with_the_reason_while_every_slot_is_held(
    start_shim: ShimFactory, upstream: Upstream
) -> None:
    shim = await start_shim(max_inflight=1)
    ready = await shim.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "upstream": "SERVING", "inflight": 0, "max_inflight": 1}
    with anyio.fail_after(10):
        async with shim.client.stream(
            "POST", "/v1/generate", json={"model": "gen-slow", "prompt": "x", "stream": True}
        ) as held:
            items = sse_items(held)
            assert (await anext(items)).name == "token"
            full = await shim.client.get("/readyz")
            assert full.status_code == 503
            assert full.json()["reason"] == "SHIM_OVERLOADED"
            assert full.json()["inflight"] == 1
            assert "in-flight slots" in full.json()["message"]
            upstream.servicer.release_slow.set()
            assert [event.name async for event in items] == ["token", "done"]
        await shim.app.state.inflight.wait_idle()
    assert (await shim.client.get("/readyz")).status_code == 200
