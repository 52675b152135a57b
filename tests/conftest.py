"""Session fixtures: one real server (embedded models) and one real shim in front of it, on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import (
    FRONTENDS,
    SHARED_MODELS,
    ServerProcess,
    ShimProcess,
    start_server,
    start_shim,
)

# Under `make test` (CI=true) a skip for a missing tool fails the run, naming it; a CUDA-marked test may skip.
# --serial-list: the serial pass's tests, written by the parallel pass (tests/support/serial_list.py).
# The modules run longest first (tests/support/module_order.py): the parallel pass ends on short ones.
pytest_plugins = ("tests.support.skips", "tests.support.serial_list", "tests.support.module_order")


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    # --kserve-shm: the tritonclient suites (gRPC and, through the shim, HTTP) use system shared memory. The
    # front-end re-run (SLUICE_TEST_FRONTENDS) holds none of them, and the server refuses shared memory behind
    # front ends (they do not forward the caller's address, which decides who may use it).
    shm = () if FRONTENDS not in (None, "1") else ("--kserve-shm", "true")
    models = ("--models", ",".join(SHARED_MODELS))
    proc = start_server(*models, "--max-queue", "256", "--stall-timeout-s", "5", *shm)
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


def pytest_configure(config: pytest.Config) -> None:
    """The test process's own torch work (references, in-process engines) on one thread: it runs beside the
    servers under test and another xdist worker on the 2-core runner, where torch's threads spin waiting on
    each other (tests/support/threads.py). The servers choose their own threads (--torch-threads)."""
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """CUDA-marked tests run only where torch sees a GPU (scripts/cuda_check.sh runs them on one)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
