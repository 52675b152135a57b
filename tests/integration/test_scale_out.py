"""Three replicas behind one shim (issue 13, acceptance 1): unary calls spread evenly; a replica killed under
64-caller load loses no call (the channel retries UNAVAILABLE elsewhere) and its SSE streams end with an
error event at once; a rolling restart (SIGTERM) fails no call and no stream that started before it; a
replica held full is skipped while the others have room."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.test_admission import request, slow
from tests.support.processes import ServerProcess, ShimProcess, start_servers, start_shim, wait_until

INFER = {"model": "mlp", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}]}
FLAGS = ("--plugins", "tests.support.faulty_models", "--models", "mlp,faulty,byte-lm", "--grace-s", "30",
         "--max-concurrency", "16", "--max-queue", "64", "--probe-interval-s", "0.02")  # fmt: skip


def _fleet() -> Iterator[tuple[list[ServerProcess], ShimProcess]]:
    servers = start_servers(3, *FLAGS)
    try:
        shim = start_shim(",".join(s.target for s in servers))
    except BaseException:
        for server in servers:
            server.terminate()
        raise
    try:
        yield servers, shim
    finally:
        shim.terminate()
        for server in servers:
            server.terminate()


@pytest.fixture
def fleet() -> Iterator[tuple[list[ServerProcess], ShimProcess]]:
    """A fleet of its own, for a test that kills or stops a replica."""
    yield from _fleet()


@pytest.fixture(scope="module")
def steady_fleet() -> Iterator[tuple[list[ServerProcess], ShimProcess]]:
    """One fleet shared by the tests that leave every replica running; they count by differences."""
    yield from _fleet()


def admitted(server: ServerProcess) -> float:
    return server.metric("sluice_requests_admitted_total", model="mlp", method="Infer")


async def load(url: str, callers: int, until: threading.Event) -> list[int]:
    """Closed-loop unary callers through the shim until `until` is set; every status they got."""
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one() -> None:
            while not until.is_set():
                statuses.append((await client.post("/v1/infer", json=INFER)).status_code)

        await asyncio.gather(*(one() for _ in range(callers)))
    return statuses


def run_load(url: str, callers: int) -> tuple[threading.Event, list[list[int]], threading.Thread]:
    stop, out = threading.Event(), []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(load(url, callers, stop))))
    thread.start()
    return stop, out, thread


def test_a_killed_replica_loses_no_call_and_ends_its_streams(
    fleet: tuple[list[ServerProcess], ShimProcess],
) -> None:
    servers, shim = fleet
    body = {"model": "byte-lm", "prompt": "hi", "max_tokens": 900, "ignore_eos": True, "stream": True}
    streams = [httpx.stream("POST", f"{shim.url}/v1/generate", json=body, timeout=60) for _ in range(6)]
    opened = [s.__enter__() for s in streams]
    lines = [r.iter_lines() for r in opened]
    for it in lines:
        next(it)
    wait_until(
        lambda: sum(s.metric("sluice_requests_in_flight", method="Generate") for s in servers) == 6,
        what="every stream running",
    )
    victim = next(s for s in servers if s.metric("sluice_requests_in_flight", method="Generate"))
    stop, out, thread = run_load(shim.url, 64)
    try:
        wait_until(lambda: admitted(victim) > 50, what="the load reaching the victim")
        ends: list[tuple[str, float]] = []

        def read(it: Iterator[str]) -> None:  # each stream read as it arrives, not after the ones before
            for line in it:
                if line.startswith(("event: error", "event: done")):
                    ends.append((line, time.monotonic()))
                    return

        readers = [threading.Thread(target=read, args=(it,)) for it in lines]
        victim.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(60)
        # The victim's streams end with an error event within 5 s; the others' run on to their end.
        errors = [at - killed for line, at in ends if line.startswith("event: error")]
        assert len(ends) == len(lines) and all(after < 5 for after in errors), (ends, errors)
        ended_with_error = len(errors)
        wait_until(
            lambda: sum(admitted(s) for s in servers if s is not victim) > 200, what="load on the rest"
        )
    finally:
        stop.set()
        thread.join(60)
        for s in streams:
            s.__exit__(None, None, None)
    statuses = out[0]
    assert statuses and set(statuses) == {200}, {c: statuses.count(c) for c in set(statuses)}
    assert ended_with_error >= 1


def test_a_rolling_restart_fails_nothing_started_before_it(
    fleet: tuple[list[ServerProcess], ShimProcess],
) -> None:
    servers, shim = fleet
    body = {"model": "byte-lm", "prompt": "hi", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=shim.url, timeout=60) as client:
        streams = [client.stream("POST", "/v1/generate", json=body) for _ in range(6)]
        opened = [s.__enter__() for s in streams]
        for response in opened:
            assert response.status_code == 200
        stop, out, thread = run_load(shim.url, 16)
        try:
            servers[0].proc.send_signal(signal.SIGTERM)
            finished = 0
            for response in opened:
                text = "".join(response.iter_lines())
                assert "event: error" not in text
                finished += "event: done" in text
            assert finished == len(opened)
        finally:
            stop.set()
            thread.join(60)
            for s in streams:
                s.__exit__(None, None, None)
    assert servers[0].proc.wait(timeout=60) == 0
    statuses = out[0]
    assert statuses and set(statuses) == {200}, {c: statuses.count(c) for c in set(statuses)}


def test_calls_spread_within_20_percent(steady_fleet: tuple[list[ServerProcess], ShimProcess]) -> None:
    servers, shim = steady_fleet
    before = [admitted(s) for s in servers]
    with httpx.Client(base_url=shim.url, timeout=30) as client:
        for _ in range(600):
            assert client.post("/v1/infer", json=INFER).status_code == 200
    counts = [admitted(s) - b for s, b in zip(servers, before, strict=True)]
    assert sum(counts) == 600 and max(counts) <= 1.2 * min(counts), counts


def test_a_replica_held_full_is_skipped(steady_fleet: tuple[list[ServerProcess], ShimProcess]) -> None:
    import grpc
    from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

    servers, shim = steady_fleet
    full = servers[0]
    with grpc.insecure_channel(full.target) as channel:  # 16 slots + 64 waiting: every place taken
        stub = pb_grpc.InferenceServiceStub(channel)
        holders = [stub.Infer.future(request("faulty", slow(2.0, i)), timeout=30) for i in range(80)]
        wait_until(
            lambda: full.metric("sluice_requests_waiting", model="faulty", method="Infer") >= 64,
            what="the replica full",
        )
        before = admitted(full)
        refused = full.metric("sluice_requests_refused_total")
        with httpx.Client(base_url=shim.url, timeout=30) as client:
            for _ in range(60):
                assert client.post("/v1/infer", json=INFER).status_code == 200
        assert admitted(full) == before and full.metric("sluice_requests_refused_total") - refused <= 2
        for holder in holders:
            holder.result()
