"""A peer that keeps as many calls open on one connection as the server allows, or wants more, is made to
wait by HTTP/2 (SETTINGS_MAX_CONCURRENT_STREAMS), never reset (issue 23, item 1): h2load at -m equal to and
above the limit, the Python client with 256 and 1,000 calls in flight on one channel, and the shim at its
--max-inflight on its one pooled channel. Overload is answered QUEUE_FULL and nothing else.

gRPC's overload protection counted streams HTTP/2 had already closed until Python freed their call objects,
and reset new ones with REFUSED_STREAM: 33,391 of 37,782 h2load calls at -m256 errored in 4 s."""

from __future__ import annotations

import asyncio
import collections
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.callers import INFER_METHOD, infer_request_bytes
from clients import AsyncSluiceClient
from clients.errors import SluiceError
from tests.support.processes import ServerProcess, start_server, start_shim

LIMIT = 256
H2LOAD = shutil.which("h2load")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = start_server(
        "--models", "mlp", "--max-concurrency", "16", "--max-queue", "16",
        "--max-streams-per-connection", str(LIMIT),
    )  # fmt: skip
    yield proc
    assert proc.terminate() == 0, proc.diagnostics()


def refused_reasons(server: ServerProcess) -> dict[str, float]:
    reasons: collections.Counter[str] = collections.Counter()
    for (name, labels), value in server.metrics().items():
        if name == "sluice_requests_refused_total" and value:
            reasons[dict(labels).get("reason", "")] += value
    return dict(reasons)


def h2load_on_one_connection(server: ServerProcess, streams: int, folder: Path) -> None:
    """h2load with `streams` calls at once on one connection: none errored (reset) or failed."""
    message = infer_request_bytes()
    body = folder / "body"
    body.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
    assert H2LOAD is not None
    done = subprocess.run(
        [
            H2LOAD, "-c1", f"-m{streams}", "-n", str(4 * streams), "-d", str(body),
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://{server.target}{INFER_METHOD}",
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    line = re.search(r"^requests: .*$", done.stdout, re.M)
    assert line is not None, done.stdout
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (\w+)", line.group(0))}
    assert counts["errored"] == 0 and counts["failed"] == 0, line.group(0)
    assert counts["succeeded"] == 4 * streams, line.group(0)
    assert set(refused_reasons(server)) <= {"QUEUE_FULL"}, refused_reasons(server)


needs_h2load = pytest.mark.skipif(H2LOAD is None, reason="h2load (Debian nghttp2-client) is not installed")


@needs_h2load
@pytest.mark.parametrize("streams", [LIMIT, 1000])
def test_h2load_on_one_connection_sees_no_reset(server: ServerProcess, streams: int, tmp_path: Path) -> None:
    h2load_on_one_connection(server, streams, tmp_path)


@pytest.mark.parametrize("calls", [LIMIT, 1000])
def test_the_python_client_with_many_calls_on_one_channel(server: ServerProcess, calls: int) -> None:
    x = np.ones(512, dtype=np.float32)

    async def storm() -> collections.Counter[str]:
        outcomes: collections.Counter[str] = collections.Counter()
        async with AsyncSluiceClient(server.target, timeout=60) as client:

            async def call() -> None:
                for _ in range(8):
                    try:
                        await client.infer("mlp", {"x": x})
                        outcomes["OK"] += 1
                    except SluiceError as error:
                        outcomes[f"{error.code.name}/{error.reason}"] += 1

            await asyncio.gather(*(call() for _ in range(calls)))
        return outcomes

    outcomes = asyncio.run(storm())
    assert outcomes["OK"] > 0, outcomes
    assert set(outcomes) <= {"OK", "RESOURCE_EXHAUSTED/QUEUE_FULL"}, outcomes


@needs_h2load
def test_the_default_limit_holds_a_shims_max_inflight(tmp_path: Path) -> None:
    """The server's default limit holds a shim's whole --max-inflight (512) on one connection: h2load at
    512 streams sees no reset (the old default, 256, reset most of them; the shim's channel retried those
    it could), and the shim itself at 512 requests in flight answers only 200 or 429 QUEUE_FULL."""
    server = start_server("--models", "mlp", "--max-concurrency", "16", "--max-queue", "16")
    h2load_on_one_connection(server, 512, tmp_path)
    shim = start_shim(server.target, "--max-inflight", "512")
    body = {
        "model": "mlp",
        "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
    }
    try:

        async def wave(outcomes: collections.Counter[str]) -> None:
            # A client per wave, one call per connection: no request rides a connection the shim's idle
            # timeout may be closing (httpx does not retry that race).
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=shim.url, limits=limits, timeout=120) as client:

                async def call() -> None:
                    answer = await client.post("/v1/infer", json=body)
                    reason = "" if answer.status_code == 200 else answer.json()["error"].get("reason", "")
                    outcomes[f"{answer.status_code}/{reason}"] += 1

                await asyncio.gather(*(call() for _ in range(512)))

        async def storm() -> collections.Counter[str]:
            outcomes: collections.Counter[str] = collections.Counter()
            for _ in range(4):
                await wave(outcomes)
            return outcomes

        outcomes = asyncio.run(storm())
        assert outcomes["200/"] > 0, outcomes
        assert set(outcomes) <= {"200/", "429/QUEUE_FULL"}, outcomes
        assert set(refused_reasons(server)) <= {"QUEUE_FULL"}, refused_reasons(server)
    finally:
        shim.terminate()
        assert server.terminate() == 0, server.diagnostics()
