"""Acceptance 3: a cancelled Generate stops token production on the server within a few decode steps,
proven from the server's own counters, for a gRPC cancel and for an SSE client that goes away."""

from __future__ import annotations

import json

import httpx

from clients import SluiceClient
from tests.support.processes import ServerProcess, ShimProcess, wait_until

MODEL = {"model": "byte-lm"}


def tokens(server: ServerProcess) -> float:
    return server.metric("sluice_tokens_generated_total", **MODEL)


def settle(server: ServerProcess) -> None:
    wait_until(lambda: server.metric("sluice_sequences_active", **MODEL) == 0, what="no active sequences")
    wait_until(
        lambda: server.metric("sluice_requests_in_flight", method="Generate") == 0, what="no stream in flight"
    )


def assert_stopped(server: ServerProcess, before: float, received: int) -> None:
    settle(server)
    produced = tokens(server) - before
    # Received tokens, plus at most the step in flight when the cancel landed, plus a couple of steps of
    # transport latency: never the remaining ~900 tokens of the request.
    assert received <= produced <= received + 8, (received, produced)
    assert server.metric("sluice_tokens_after_cancel_total", **MODEL) == 0
    stable = tokens(server)
    assert stable == tokens(server)


def test_grpc_cancel_stops_generation(server: ServerProcess) -> None:
    settle(server)
    before = tokens(server)
    received = 0
    with SluiceClient(server.target) as client:
        stream = client.generate("byte-lm", "cancel me", max_tokens=900, seed=1)
        for chunk in stream:
            received += len(chunk.token_ids)
            if received >= 20:
                stream.cancel()
                break
    assert_stopped(server, before, received)


def test_closing_the_sse_connection_stops_generation(server: ServerProcess, shim: ShimProcess) -> None:
    settle(server)
    before = tokens(server)
    received = 0
    body = {"model": "byte-lm", "prompt": "disconnect", "max_tokens": 900, "seed": 2, "stream": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{shim.url}/v1/generate", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and (data := json.loads(line[5:])).get("token_ids"):
                received += len(data["token_ids"])
            if received >= 20:
                break  # leaving the block closes the connection
    assert_stopped(server, before, received)
