"""Issue 36, item 1: who may use system shared memory, through the real KServeServicer and SharedMemory with a
context whose peer is given (every real test peer is on loopback). Off unless enabled; a remote peer, or a
local proxy's remote x-forwarded-for, is PERMISSION_DENIED; objects outside the caller's prefix, links and
FIFOs are refused; a truncated object fails the read, not the process; the per-tenant cap holds."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2, status_pb2
from sluice.kserve.v2 import grpc_service_pb2 as v2

from auth.keys import TenantEntry
from server.admission.tenants import CALLER, Tenant
from server.domain import Priority
from server.errors import InvalidArgument, PermissionDenied
from server.kserve.peers import is_local, remote_address
from server.kserve.servicer import KServeServicer
from server.kserve.shm import SharedMemory, ShmLimits
from server.servicer import InferenceServicer

LOCAL = "ipv4:127.0.0.1:40000"
REMOTE = "ipv4:10.1.2.3:5000"


class Aborted(Exception):
    """What abort was called with: the code, the message and the ErrorInfo reason of the details."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: Any) -> None:
        super().__init__(details)
        self.code, self.details, self.reason = code, details, ""
        for key, value in trailers:
            if key == "grpc-status-details-bin":
                for detail in status_pb2.Status.FromString(value).details:
                    if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                        info = error_details_pb2.ErrorInfo()
                        detail.Unpack(info)
                        self.reason = info.reason


class PeerContext:
    """What SharedMemory reads of a grpc.aio ServicerContext: the peer, the metadata, abort."""

    def __init__(self, peer: str | None, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._peer, self.metadata = peer, metadata

    def peer(self) -> str | None:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str, trailers: Any = ()) -> None:
        raise Aborted(code, details, trailers)


def peer_context(peer: str | None, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    """A PeerContext where the servicer takes a grpc.aio ServicerContext."""
    return PeerContext(peer, metadata)


def run(call: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(call)


def refused(call: Coroutine[Any, Any, Any]) -> Aborted:
    with pytest.raises(Aborted) as info:
        run(call)
    return info.value


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path


def make_object(root: Path, name: str, data: bytes) -> Path:
    path = root / name
    path.write_bytes(data)
    return path


def servicer(root: Path, **limits: Any) -> KServeServicer:
    shm = SharedMemory(ShmLimits(**{"enabled": True, **limits}), tenants=("alpha", "beta"), root=root)
    return KServeServicer(InferenceServicer(), ready=lambda: True, version="t", shm=shm)


def register(name: str, key: str, size: int, offset: int = 0) -> v2.SystemSharedMemoryRegisterRequest:
    return v2.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=size)


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("ipv4:127.0.0.1:1", True), ("ipv4:127.8.9.1:1", True), ("ipv6:[::1]:1", True),
        ("ipv6:[::ffff:127.0.0.1]:1", True), ("unix:/run/sluice.sock", True), ("unix-abstract:s", True),
        ("ipv4:10.1.2.3:5000", False), ("ipv6:[2001:db8::1]:1", False), ("ipv6:[::ffff:10.0.0.1]:1", False),
        ("ipv4:0.0.0.0:1", False), ("dns:localhost:1", False), ("", False), ("garbage", False),
    ],
)  # fmt: skip
def test_which_peers_are_this_host(peer: str, local: bool) -> None:
    assert is_local(peer) is local


def test_a_local_proxy_passes_on_its_callers_address() -> None:
    assert remote_address(LOCAL, ()) is None
    assert remote_address(LOCAL, (("x-forwarded-for", "127.0.0.1, ::1"),)) is None
    assert remote_address(LOCAL, (("x-forwarded-for", "127.0.0.1, 10.1.2.3"),)) == "10.1.2.3"
    assert remote_address(LOCAL, (("x-forwarded-for", "localhost"),)) == "localhost"  # a name proves nothing
    assert remote_address(REMOTE, (("x-forwarded-for", "127.0.0.1"),)) == REMOTE  # remote can't claim local
    assert remote_address(None, ()) is not None


def test_a_remote_caller_is_refused_every_shared_memory_rpc(root: Path) -> None:
    make_object(root, "sluice-shm-x", bytes(64))
    kserve = servicer(root)
    remote = peer_context(REMOTE)
    for call in (
        kserve.SystemSharedMemoryRegister(register("r", "/sluice-shm-x", 64), remote),
        kserve.SystemSharedMemoryStatus(v2.SystemSharedMemoryStatusRequest(), remote),
        kserve.SystemSharedMemoryUnregister(v2.SystemSharedMemoryUnregisterRequest(), remote),
    ):
        error = refused(call)
        assert error.code == grpc.StatusCode.PERMISSION_DENIED and error.reason == "SHM_NOT_LOCAL"
        assert "10.1.2.3:5000" in error.details
    assert kserve.shm.regions == {}
    # A region a local caller registered cannot be read by the same tenant calling from elsewhere.
    run(kserve.SystemSharedMemoryRegister(register("r", "/sluice-shm-x", 64), peer_context(LOCAL)))
    for context in (
        peer_context(REMOTE),
        peer_context(LOCAL, (("x-forwarded-for", "10.9.9.9"),)),
        peer_context(None),
    ):
        read = kserve.shm.reader(context)
        assert read is not None
        with pytest.raises(PermissionDenied, match="only to callers on the server's host"):
            read("r", 0, 64, "inputs[0]")
    read = kserve.shm.reader(peer_context("unix:/run/s.sock"))
    assert read is not None and bytes(read("r", 0, 64, "inputs[0]")) == bytes(64)


def test_off_unless_enabled(root: Path) -> None:
    make_object(root, "sluice-shm-x", bytes(64))
    shm = SharedMemory(ShmLimits(), root=root)
    kserve = KServeServicer(InferenceServicer(), ready=lambda: True, version="t", shm=shm)
    error = refused(
        kserve.SystemSharedMemoryRegister(register("r", "/sluice-shm-x", 64), peer_context(LOCAL))
    )
    assert error.code == grpc.StatusCode.UNIMPLEMENTED and error.reason == "FEATURE_OFF"
    assert "--kserve-shm" in error.details
    assert shm.reader(peer_context(LOCAL)) is None  # decoding: "not served here"
    metadata = run(kserve.ServerMetadata(v2.ServerMetadataRequest(), peer_context(LOCAL)))
    assert "system_shared_memory" not in metadata.extensions
    metadata = run(servicer(root).ServerMetadata(v2.ServerMetadataRequest(), peer_context(LOCAL)))
    assert "system_shared_memory" in metadata.extensions


def as_tenant(name: str) -> Any:
    entry = TenantEntry(name, b"", "normal", 1.0, 1.0, None)
    return CALLER.set(Tenant(entry=entry, priority_ceiling=Priority.NORMAL))


def test_a_caller_opens_only_its_own_plain_objects(root: Path) -> None:
    for name in ("sluice-shm-alpha-in", "sluice-shm-beta-in", "sluice-abcdef0123456789", "pulse-shm-1"):
        make_object(root, name, bytes(64))
    os.symlink(root / "sluice-shm-beta-in", root / "sluice-shm-alpha-link")
    os.link(root / "pulse-shm-1", root / "sluice-shm-alpha-hard")
    os.mkfifo(root / "sluice-shm-alpha-fifo")
    kserve = servicer(root)
    token = as_tenant("alpha")
    try:
        run(
            kserve.SystemSharedMemoryRegister(register("in", "/sluice-shm-alpha-in", 64), peer_context(LOCAL))
        )
        others = ("/sluice-shm-beta-in", "/sluice-abcdef0123456789", "/pulse-shm-1")
        for key in (*others, "/sluice-shm-alpha-hard", "/sluice-shm-alpha-fifo"):
            error = refused(kserve.SystemSharedMemoryRegister(register("r", key, 64), peer_context(LOCAL)))
            assert (error.code, error.reason) == (grpc.StatusCode.PERMISSION_DENIED, "SHM_KEY_NOT_ALLOWED"), (
                key
            )
        error = refused(
            kserve.SystemSharedMemoryRegister(
                register("r", "/sluice-shm-alpha-link", 64), peer_context(LOCAL)
            )
        )
        assert (
            error.code == grpc.StatusCode.INVALID_ARGUMENT and "on this host" in error.details
        )  # not followed
    finally:
        CALLER.reset(token)
    assert [name for _, name in kserve.shm.regions] == ["in"]


def test_tenant_names_whose_objects_would_overlap_are_refused_at_start_up(root: Path) -> None:
    with pytest.raises(ValueError, match="would include tenant 'a-b'"):
        SharedMemory(ShmLimits(enabled=True), tenants=("a-b", "a"), root=root)
    with pytest.raises(ValueError, match="cannot name shared-memory objects"):
        SharedMemory(ShmLimits(enabled=True), tenants=("a/b",), root=root)
    SharedMemory(ShmLimits(enabled=False), tenants=("a-b", "a"), root=root)  # off: nothing to check


def test_a_truncated_object_fails_the_read_not_the_server(root: Path) -> None:
    values = np.arange(1024, dtype=np.float32)
    path = make_object(root, "sluice-shm-t", values.tobytes())
    kserve = servicer(root)
    run(kserve.SystemSharedMemoryRegister(register("t", "/sluice-shm-t", values.nbytes), peer_context(LOCAL)))
    read = kserve.shm.reader(peer_context(LOCAL))
    assert read is not None
    np.testing.assert_array_equal(np.frombuffer(read("t", 0, values.nbytes, "inputs[0]"), np.float32), values)
    os.truncate(path, 100)
    with pytest.raises(InvalidArgument, match=r"now holds 100 \(truncated"):
        read("t", 0, values.nbytes, "inputs[0]")
    assert bytes(read("t", 0, 100, "inputs[0]")) == values.tobytes()[:100]  # what is still there is served
    os.truncate(path, values.nbytes)  # grown back (zeros): served again
    assert bytes(read("t", 0, values.nbytes, "inputs[0]")) == values.tobytes()[:100] + bytes(
        values.nbytes - 100
    )


def test_the_cap_holds_per_tenant(root: Path) -> None:
    for name in ("sluice-shm-alpha-a", "sluice-shm-beta-a"):
        make_object(root, name, bytes(4096))
    kserve = servicer(root, max_regions=2, max_bytes=3000)
    local = peer_context(LOCAL)

    def register_as(tenant: str, name: str, size: int) -> Aborted | None:
        token = as_tenant(tenant)
        try:
            run(kserve.SystemSharedMemoryRegister(register(name, f"/sluice-shm-{tenant}-a", size), local))
        except Aborted as error:
            return error
        finally:
            CALLER.reset(token)
        return None

    assert register_as("alpha", "one", 1000) is None
    assert register_as("alpha", "two", 1000) is None
    error = register_as("alpha", "three", 1)
    assert error is not None and (error.code, error.reason) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "SHM_QUOTA",
    )
    assert "2 regions" in error.details
    assert register_as("beta", "one", 2500) is None  # another tenant's cap is its own
    error = register_as("beta", "two", 501)
    assert error is not None and error.reason == "SHM_QUOTA" and "3000 bytes" in error.details
    token = as_tenant("alpha")
    try:
        run(kserve.SystemSharedMemoryUnregister(v2.SystemSharedMemoryUnregisterRequest(name="one"), local))
    finally:
        CALLER.reset(token)
    assert register_as("alpha", "three", 2000) is None  # unregistering gives the room back
