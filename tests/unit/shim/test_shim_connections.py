"""connections.py: each phase's deadline (silent, slow headers, kept alive, draining), the error shape for
bytes that are not HTTP, and the connection cap that closes the longest-idle connection for a new one."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from conftest import RunningShim, ShimFactory, Upstream, eventually
from raw_http import RawConnections, read_response, read_until_closed, request_head

pytestmark = pytest.mark.anyio

ERROR_KEYS = {"code", "message", "reason", "domain", "metadata", "field_violations", "retry_after_s"}


async def wait_for_held(shim: RunningShim, count: int) -> None:
    await eventually(lambda: shim.pool.held == count, f"{count} connections held")


async def test_a_connection_that_never_sends_a_byte_is_closed_after_the_idle_timeout(
    start_shim: ShimFactory,
    raw: RawConnections,
) -> None:
    shim = await start_shim(idle_timeout_s=0.3, header_timeout_s=30)
    started = time.monotonic()
    reader, writer = await raw.open(shim.port)
    assert await read_until_closed(reader) == b""
    assert 0.25 < time.monotonic() - started < 5
    writer.close()
    await wait_for_held(shim, 0)


async def test_headers_sent_a_byte_at_a_time_get_408_at_the_header_deadline(
    start_shim: ShimFactory, raw: RawConnections
) -> None:
    shim = await start_shim(header_timeout_s=0.5, idle_timeout_s=30)
    reader, writer = await raw.open(shim.port)
    started = time.monotonic()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: shim\r\n")

    async def trickle() -> None:
        # A slowloris client: every byte would renew a deadline measured from the last byte.
        with contextlib.suppress(ConnectionError):
            while not writer.is_closing():
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    try:
        response = await read_response(reader)
        assert response.status == 408
        assert response.headers["connection"] == "close"
        error = response.json()["error"]
        assert set(error) == ERROR_KEYS
        assert error["reason"] == "REQUEST_TIMEOUT"
        assert 0.45 < time.monotonic() - started < 5
        assert await read_until_closed(reader) == b""
    finally:
        writer.close()
        trickling.cancel()


async def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(
    start_shim: ShimFactory, raw: RawConnections
) -> None:
    shim = await start_shim(idle_timeout_s=0.3)
    reader, writer = await raw.open(shim.port)
    for _ in range(2):  # the connection is reusable until it idles
        writer.write(request_head("GET", "/healthz"))
        assert (await read_response(reader)).status == 200
    answered = time.monotonic()
    assert await read_until_closed(reader) == b""
    assert 0.25 < time.monotonic() - answered < 5
    writer.close()


async def test_a_body_left_unread_after_a_refusal_is_drained_for_the_body_timeout_only(
    start_shim: ShimFactory, upstream: Upstream, raw: RawConnections
) -> None:
    shim = await start_shim(body_timeout_s=0.5, idle_timeout_s=30)
    reader, writer = await raw.open(shim.port)
    writer.write(
        request_head("POST", "/v1/infer", headers={"Content-Type": "text/plain", "Content-Length": "1000"})
    )
    refused = await read_response(reader)
    assert refused.status == 415  # answered before the body, which never comes
    answered = time.monotonic()
    writer.write(b"x" * 10)  # a trickle does not keep it open
    assert await read_until_closed(reader) == b""
    assert 0.45 < time.monotonic() - answered < 5
    assert upstream.servicer.infer_attempts == 0
    writer.close()


async def test_bytes_that_are_not_http_get_400_in_the_error_shape(
    shim: RunningShim, raw: RawConnections
) -> None:
    reader, writer = await raw.open(shim.port)
    writer.write(b"HELLO THERE\r\n\r\n")
    response = await read_response(reader)
    assert response.status == 400
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["reason"] == "MALFORMED_HTTP"
    assert await read_until_closed(reader) == b""
    writer.close()


async def test_at_the_cap_the_longest_idle_connection_makes_room(
    start_shim: ShimFactory, raw: RawConnections
) -> None:
    shim = await start_shim(max_connections=3, idle_timeout_s=30, header_timeout_s=30)
    idle = []
    for held in range(1, 4):
        idle.append(await raw.open(shim.port))
        await wait_for_held(shim, held)
    # The middle one has sent part of a request: still reusable, and younger than the first.
    idle[1][1].write(b"GET /hea")
    reader, writer = await raw.open(shim.port)
    writer.write(request_head("GET", "/healthz"))
    assert (await read_response(reader)).status == 200
    oldest_reader, _ = idle[0]
    assert await read_until_closed(oldest_reader) == b""
    assert shim.pool.held == 3
    for _, idle_writer in idle:
        idle_writer.close()
    writer.close()


async def test_at_the_cap_with_every_connection_serving_a_new_one_is_closed_unread(
    start_shim: ShimFactory, upstream: Upstream, raw: RawConnections
) -> None:
    shim = await start_shim(max_connections=1, idle_timeout_s=30)
    reader, writer = await raw.open(shim.port)
    body = b'{"model": "gen-slow", "prompt": "x", "stream": true}'
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    writer.write(request_head("POST", "/v1/generate", headers=headers) + body)
    assert b"event: token" in await asyncio.wait_for(reader.readuntil(b"\n\n"), 10)
    turned_away, turned_away_writer = await raw.open(shim.port)
    turned_away_writer.write(request_head("GET", "/healthz"))
    assert await read_until_closed(turned_away) == b""
    upstream.servicer.release_slow.set()
    rest = await asyncio.wait_for(reader.readuntil(b"event: done\n"), 10)
    assert b"event: token" in rest
    turned_away_writer.close()
    writer.close()
