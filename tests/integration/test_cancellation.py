"""Acceptance 3: a cancelled Generate stops token production on the server within a few decode steps,
proven from the server's own counters, for a gRPC cancel and for an SSE client that goes away."""

from __future__ import annotations

import json

import httpx
import pytest

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


def discarded(server: ServerProcess) -> float:
    return server.metric("sluice_tokens_discarded_total", **MODEL)


def assert_stopped(server: ServerProcess, before: tuple[float, float], received: int) -> None:
    """From the server's side: once the cancellation reached it, at most the decode step computing and the one
    already handed over behind it (the scheduler plans a step ahead, server/batching/lookahead.py) produced a
    token each (discarded, never sent) and no later step computed one; end to end, production stopped
    a transport's worth of buffered tokens after the last one the client read, far short of max_tokens."""
    settle(server)
    produced = tokens(server) - before[0]
    assert discarded(server) - before[1] <= 2
    assert server.metric("sluice_tokens_after_cancel_total", **MODEL) == 0
    # Between the client and the scheduler sit the client's read buffer, the socket, and for SSE the
    # shim and the gRPC stream window: a few dozen 1 ms steps of the tiny model at most, not ~880.
    assert received <= produced <= received + 64, (received, produced)
    assert server.metric("sluice_kv_slots_in_use", **MODEL) == 0


def test_grpc_cancel_stops_generation(server: ServerProcess) -> None:
    settle(server)
    before = (tokens(server), discarded(server))
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
    before = (tokens(server), discarded(server))
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


def test_a_client_leaving_a_non_streamed_generate_cancels_it(
    server: ServerProcess, shim: ShimProcess
) -> None:
    settle(server)
    before = (tokens(server), discarded(server))
    body = {"model": "byte-lm", "prompt": "gone", "max_tokens": 1000, "seed": 3, "temperature": 0.0}
    with httpx.Client(timeout=httpx.Timeout(30, read=0.1)) as http, pytest.raises(httpx.ReadTimeout):
        http.post(f"{shim.url}/v1/generate", json=body)  # one JSON answer; the client gives up waiting
    settle(server)
    produced = tokens(server) - before[0]
    assert produced < 1000, "the shim computed an answer its client had left"
    assert discarded(server) - before[1] <= 2
    assert server.metric("sluice_tokens_after_cancel_total", **MODEL) == 0
