"""Fixtures for the shim's unit tests: a deterministic in-process InferenceService on port 0, and the
shim itself served by a real uvicorn on port 0 with the shim's own socket, configuration and connection
protocol (SSE, disconnects and connection timers need a real HTTP server)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from raw_http import RawConnections
from shim_fakes import FakeInference
from sluice.inference.v1 import inference_pb2_grpc

from shim.app import create_app
from shim.config import ShimSettings
from shim.connections import ConnectionPool
from shim.serving import bind_socket, server_config


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Upstream:
    target: str
    servicer: FakeInference
    health: health.aio.HealthServicer


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = grpc.aio.server()
    servicer = FakeInference()
    health_servicer = health.aio.HealthServicer()
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Upstream(target=f"127.0.0.1:{port}", servicer=servicer, health=health_servicer)
    finally:
        await server.stop(grace=None)


class _ReadyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@dataclass
class RunningShim:
    base_url: str
    port: int
    app: Any
    client: httpx.AsyncClient
    pool: ConnectionPool  # the connections uvicorn holds for this shim


ShimFactory = Callable[..., Awaitable[RunningShim]]


async def eventually(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Waits until `predicate` holds, for state that offers nothing to await (counts kept by uvicorn)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # nothing to await: uvicorn keeps these counts without signalling
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.fixture
async def start_shim(upstream: Upstream) -> AsyncIterator[ShimFactory]:
    """Starts the shim against the fake upstream with settings overrides; stops it after the test."""
    running: list[tuple[_ReadyServer, asyncio.Task[None], httpx.AsyncClient, socket.socket]] = []

    async def start(**overrides: Any) -> RunningShim:
        settings = ShimSettings(upstream=overrides.pop("upstream", upstream.target), port=0, **overrides)
        app = create_app(settings)
        sock = bind_socket("127.0.0.1", 0)
        config = server_config(app, settings, max_connections=settings.max_connections or 1000)
        server = _ReadyServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        await asyncio.wait({task, asyncio.ensure_future(server.ready.wait())}, return_when="FIRST_COMPLETED")
        assert server.started, "uvicorn did not start"
        port = int(sock.getsockname()[1])
        base_url = f"http://127.0.0.1:{port}"
        client = httpx.AsyncClient(base_url=base_url, timeout=10.0)
        running.append((server, task, client, sock))
        pool = config.http.pool  # type: ignore[union-attr]
        return RunningShim(base_url=base_url, port=port, app=app, client=client, pool=pool)

    try:
        yield start
    finally:
        for server, task, client, sock in running:
            await client.aclose()
            server.should_exit = True
            await task
            sock.close()


@pytest.fixture
async def shim(start_shim: ShimFactory) -> RunningShim:
    return await start_shim(sse_heartbeat_s=30.0)


@pytest.fixture
async def raw() -> AsyncIterator[RawConnections]:
    """Raw HTTP/1.1 connections for hostile-client tests; all closed after the test."""
    connections = RawConnections()
    try:
        yield connections
    finally:
        await connections.close_all()
