"""Issue 36, item 1, against the real server (--kserve-shm true, a cap of 2 regions and 4 MiB): a client that
truncates its object while the server reads it leaves the server serving (on 6c0ff0d the mapping read in
place raised SIGBUS and the process died with -7); the per-caller cap holds; a call a local proxy forwards
for another host is refused; an object outside the caller's prefix is refused. Objects are real
/dev/shm objects, made as tritonclient makes them (a file in /dev/shm, which is what shm_open creates)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sluice.kserve.v2 import grpc_service_pb2 as v2
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc

from tests.support.processes import ServerProcess, start_server

SHM = Path("/dev/shm")
MIB = 1024 * 1024
CALLS = 200  # reads by reference while the object is truncated and grown back


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(
        "--plugins", "tests.support.faulty_models", "--models", "vector-sum", "--kserve-shm", "true",
        "--kserve-shm-max-regions", "2", "--kserve-shm-max-bytes", str(4 * MIB),
    )  # fmt: skip
    yield process
    assert process.terminate() == 0


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[v2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield v2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def objects() -> Iterator[list[Path]]:
    """The /dev/shm objects a test made, removed after it; every region unregistered."""
    made: list[Path] = []
    yield made
    for path in made:
        path.unlink(missing_ok=True)


def make(objects: list[Path], name: str, data: bytes) -> Path:
    path = SHM / f"{name}-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    objects.append(path)
    return path


def by_reference(region: str, size: int) -> v2.ModelInferRequest:
    message = v2.ModelInferRequest(model_name="vector-sum")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, size // 4])
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = size
    return message


def by_value(values: np.ndarray) -> v2.ModelInferRequest:
    message = v2.ModelInferRequest(model_name="vector-sum")
    message.inputs.add(name="x", datatype="FP32", shape=[1, values.size])
    message.raw_input_contents.append(values.astype(np.float32).tobytes())
    return message


def total(answer: v2.ModelInferResponse) -> float:
    return float(np.frombuffer(answer.raw_output_contents[0], np.float32)[0])


def reason(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "every error carries google.rpc details"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


def register(stub: v2_grpc.GRPCInferenceServiceStub, name: str, path: Path, size: int, **kw: object) -> None:
    request = v2.SystemSharedMemoryRegisterRequest(name=name, key=f"/{path.name}", byte_size=size)
    stub.SystemSharedMemoryRegister(request, timeout=10, **kw)  # type: ignore[arg-type]


def unregister_all(stub: v2_grpc.GRPCInferenceServiceStub) -> None:
    stub.SystemSharedMemoryUnregister(v2.SystemSharedMemoryUnregisterRequest(), timeout=10)


def test_a_client_truncating_its_object_mid_use_leaves_the_server_serving(
    server: ServerProcess, stub: v2_grpc.GRPCInferenceServiceStub, objects: list[Path]
) -> None:
    values = np.ones(MIB // 4, np.float32)
    path = make(objects, "sluice-shm-trunc", values.tobytes())
    register(stub, "t", path, values.nbytes)
    try:
        assert total(stub.ModelInfer(by_reference("t", values.nbytes), timeout=10)) == values.size
        os.truncate(path, 0)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(by_reference("t", values.nbytes), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        assert "truncated since it was registered" in str(info.value.details())
        # Shrunk and grown again while the server reads: each call is answered or refused, never fatal.
        stop = threading.Event()

        def flip() -> None:
            while not stop.is_set():
                os.truncate(path, 0)
                os.truncate(path, values.nbytes)

        flipper = threading.Thread(target=flip)
        flipper.start()
        codes = set()
        try:
            for _ in range(CALLS):
                try:
                    stub.ModelInfer(by_reference("t", values.nbytes), timeout=10)
                    codes.add(grpc.StatusCode.OK)
                except grpc.RpcError as error:
                    codes.add(error.code())
        finally:
            stop.set()
            flipper.join()
        assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}, codes
        assert server.proc.poll() is None, server.diagnostics()
        assert total(stub.ModelInfer(by_value(np.ones(8)), timeout=10)) == 8.0
    finally:
        unregister_all(stub)


def test_the_cap_holds(stub: v2_grpc.GRPCInferenceServiceStub, objects: list[Path]) -> None:
    path = make(objects, "sluice-shm-cap", bytes(4 * MIB))
    try:
        register(stub, "one", path, MIB)
        register(stub, "two", path, MIB)
        with pytest.raises(grpc.RpcError) as info:
            register(stub, "three", path, 4)
        assert (info.value.code(), reason(info.value)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "SHM_QUOTA")
        stub.SystemSharedMemoryUnregister(v2.SystemSharedMemoryUnregisterRequest(name="two"), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            register(stub, "big", path, 3 * MIB + 1)  # 1 MiB held: 4 MiB passes the byte cap
        assert reason(info.value) == "SHM_QUOTA" and "4194304 bytes" in str(info.value.details())
        register(stub, "big", path, 3 * MIB)
        status = stub.SystemSharedMemoryStatus(v2.SystemSharedMemoryStatusRequest(), timeout=10)
        assert sorted(status.regions) == ["big", "one"]
    finally:
        unregister_all(stub)


def test_a_call_forwarded_for_another_host_is_refused(
    stub: v2_grpc.GRPCInferenceServiceStub, objects: list[Path]
) -> None:
    path = make(objects, "sluice-shm-fwd", bytes(64))
    forwarded = (("x-forwarded-for", "10.1.2.3"),)
    with pytest.raises(grpc.RpcError) as info:
        register(stub, "r", path, 64, metadata=forwarded)
    assert (info.value.code(), reason(info.value)) == (grpc.StatusCode.PERMISSION_DENIED, "SHM_NOT_LOCAL")
    assert "10.1.2.3" in str(info.value.details())
    register(stub, "r", path, 64)  # the same call from this host
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(by_reference("r", 64), metadata=forwarded, timeout=10)
        assert reason(info.value) == "SHM_NOT_LOCAL"
        assert total(stub.ModelInfer(by_reference("r", 64), timeout=10)) == 0.0
    finally:
        unregister_all(stub)


def test_an_object_outside_the_callers_prefix_is_refused(
    stub: v2_grpc.GRPCInferenceServiceStub, objects: list[Path]
) -> None:
    path = make(objects, "other-program", bytes(64))
    with pytest.raises(grpc.RpcError) as info:
        register(stub, "r", path, 64)
    assert (info.value.code(), reason(info.value)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "SHM_KEY_NOT_ALLOWED",
    )
    assert "sluice-shm-*" in str(info.value.details())


def test_an_output_region_is_refused_so_the_server_never_writes_a_callers_object(
    stub: v2_grpc.GRPCInferenceServiceStub, objects: list[Path]
) -> None:
    """A guard, already true on 6c0ff0d: outputs travel in the response, so no write can fault either."""
    path = make(objects, "sluice-shm-out", bytes(64))
    register(stub, "out", path, 64)
    try:
        message = by_value(np.ones(4))
        output = message.outputs.add(name="y")
        output.parameters["shared_memory_region"].string_param = "out"
        output.parameters["shared_memory_byte_size"].int64_param = 4
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shared memory takes inputs only" in str(info.value.details())
        assert path.read_bytes() == bytes(64)
    finally:
        unregister_all(stub)
