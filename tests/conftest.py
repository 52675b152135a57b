"""Session fixtures: one real server (embedded models) and one real shim in front of it, on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    proc = start_server("--max-queue", "256", "--stall-timeout-s", "5")
    yield proc
    assert proc.terminate() == 0, proc.diagnostics()


@pytest.fixture(scope="session")
def shim(server: ServerProcess) -> Iterator[ShimProcess]:
    proc = start_shim(server.target)
    yield proc
    proc.terminate()


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.InferenceServiceStub:
    return pb_grpc.InferenceServiceStub(channel)
