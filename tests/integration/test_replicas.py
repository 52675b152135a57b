"""One channel, many replicas (issue 13, item 1): the Python client and the shim take `host:port,host:port`;
calls are balanced round_robin over the replicas whose `sluice.readiness` says SERVING; a draining replica
stops receiving new calls; a replica killed mid-stream ends that stream with a clear error at once and the
next calls go to the one left."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest

from clients import SluiceClient, SluiceError
from tests.support.processes import ServerProcess, start_servers, start_shim, wait_until

X = {"x": np.ones(512, np.float32)}


def admitted(server: ServerProcess) -> float:
    return server.metric("sluice_requests_admitted_total", model="mlp", method="Infer")


def _replicas() -> Iterator[list[ServerProcess]]:
    servers = start_servers(2, "--models", "mlp,byte-lm", "--grace-s", "30")
    try:
        yield servers
    finally:
        for server in servers:
            server.terminate()


@pytest.fixture
def replicas() -> Iterator[list[ServerProcess]]:
    """Two replicas of its own, for a test that drains, kills or freezes one."""
    yield from _replicas()


@pytest.fixture(scope="module")
def steady_replicas() -> Iterator[list[ServerProcess]]:
    """Two replicas shared by the tests that leave both serving; they count by differences."""
    yield from _replicas()


def both(servers: list[ServerProcess]) -> str:
    return ",".join(server.target for server in servers)


def in_flight(server: ServerProcess) -> float:
    return server.metric("sluice_requests_in_flight", method="Generate")


def _healthy(client: SluiceClient, server: ServerProcess) -> bool:
    """True once a call has reached `server` through the balanced channel."""
    before = admitted(server)
    for _ in range(4):
        client.infer("mlp", X)
    return admitted(server) > before


@pytest.mark.serial  # races the holder's 900-token stream against 30 calls: run alone
def test_a_draining_replica_gets_no_new_calls(replicas: list[ServerProcess]) -> None:
    draining, other = replicas
    with SluiceClient(both(replicas), timeout=30) as client:
        stream = client.generate("byte-lm", "keep the drain open", max_tokens=900, ignore_eos=True)
        next(iter(stream))  # a long stream holds one replica in its grace period
        holder = draining if in_flight(draining) else other
        assert in_flight(holder) == 1, (in_flight(draining), in_flight(other))
        rest = other if holder is draining else draining
        holder.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: holder.readiness() == "NOT_SERVING", what="the holder draining")
        before, refused = admitted(holder), holder.metric("sluice_requests_refused_total", method="Infer")
        for _ in range(30):  # every one answered: the channel's health watch took the holder out
            client.infer("mlp", X)
        assert admitted(holder) == before
        # Not even refused there (a retry would hide that): at most the calls already on their way.
        assert holder.metric("sluice_requests_refused_total", method="Infer") - refused <= 2
        assert admitted(rest) >= 30
        stream.cancel()


def test_a_replica_killed_mid_stream_ends_the_stream_and_calls_go_on(replicas: list[ServerProcess]) -> None:
    with SluiceClient(both(replicas), timeout=30) as client:
        stream = iter(client.generate("byte-lm", "hello", max_tokens=900, ignore_eos=True, timeout=60))
        next(stream)
        victim = next(s for s in replicas if in_flight(s))
        victim.proc.send_signal(signal.SIGKILL)
        with pytest.raises(SluiceError) as ended:
            for _ in stream:
                pass
        assert ended.value.code == grpc.StatusCode.UNAVAILABLE
        for _ in range(10):
            client.infer("mlp", X)


def test_a_replica_that_stops_answering_ends_its_stream_within_the_keepalive(
    replicas: list[ServerProcess],
) -> None:
    """A frozen process (SIGSTOP: its sockets stay open, nothing answers) is found by the channel's pings:
    the stream ends UNAVAILABLE within keepalive time + timeout (10 + 5 s). Before the channel bounded
    every ping's wait, a flow-control ping sent as the replica froze held the stream 60 s."""
    import time

    with SluiceClient(both(replicas), timeout=120) as client:
        stream = iter(client.generate("byte-lm", "hello", max_tokens=900, ignore_eos=True))
        next(stream)
        frozen = next(s for s in replicas if in_flight(s))
        frozen.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(SluiceError) as ended:
                for _ in stream:
                    pass
            waited = time.monotonic() - started
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
    assert ended.value.code == grpc.StatusCode.UNAVAILABLE
    assert waited < 20, waited


def test_calls_are_balanced_over_the_replicas(steady_replicas: list[ServerProcess]) -> None:
    replicas = steady_replicas
    before = [admitted(server) for server in replicas]
    with SluiceClient(both(replicas), timeout=30) as client:
        wait_until(lambda: all(_healthy(client, s) for s in replicas), what="both replicas connected")
        for _ in range(40):
            client.infer("mlp", X)
    counts = [admitted(server) - b for server, b in zip(replicas, before, strict=True)]
    assert sum(counts) >= 40 and min(counts) >= 10, counts  # round_robin: about 20 each


def test_the_shim_balances_over_replicas(steady_replicas: list[ServerProcess]) -> None:
    replicas = steady_replicas
    before = [admitted(server) for server in replicas]
    shim = start_shim(both(replicas))
    try:
        body = {
            "model": "mlp",
            "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
        }
        for _ in range(40):
            assert httpx.post(f"{shim.url}/v1/infer", json=body, timeout=30).status_code == 200
    finally:
        shim.terminate()
    counts = [admitted(server) - b for server, b in zip(replicas, before, strict=True)]
    assert min(counts) >= 10, counts
