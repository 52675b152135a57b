"""SharedMemory: the protocol's system shared memory extension. A caller on the same host registers a
POSIX shared-memory object (`/dev/shm/<key>`, as tritonclient.utils.shared_memory creates it) under a name,
then sends inputs by reference: the request carries the region, offset and size, and the server reads the
tensor in place from its mapping, so a large input is never serialised into the message.

Regions belong to the caller that registered them: its tenant when the server checks tokens (--auth-keys),
else the one anonymous caller. Another tenant's region is unknown to a caller (its name is not revealed);
an unregistered region, or bytes outside the registered span or the object, are INVALID_ARGUMENT."""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.admission.handlers import Context, abort
from server.admission.tenants import CALLER
from server.errors import InvalidArgument, SluiceError, clip

SHM_ROOT = Path("/dev/shm")


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap


class SharedMemory:
    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.root = root
        self.regions: dict[tuple[str, str], Region] = {}

    def read(self, owner: str, name: str, offset: int, size: int, path: str) -> memoryview:
        """`size` bytes at `offset` within the caller's region `name`, read in place."""
        region = self.regions.get((owner, name))
        field = f"{path}.parameters.shared_memory_region"
        if region is None:
            raise InvalidArgument(
                f"{path}: no shared memory region {clip(name)!r} is registered", field=field
            )
        if offset + size > region.byte_size:
            raise InvalidArgument(
                f"{path}: bytes {offset}..{offset + size} lie outside region {clip(name)!r} "
                f"({region.byte_size} bytes)",
                field=field,
            )
        start = region.offset + offset
        return memoryview(region.mapping)[start : start + size]

    async def register(
        self, request: v2.SystemSharedMemoryRegisterRequest, context: Context
    ) -> v2.SystemSharedMemoryRegisterResponse:
        try:
            self._register(_owner(), request)
        except SluiceError as error:
            await abort(context, error)
            raise
        return v2.SystemSharedMemoryRegisterResponse()

    def _register(self, owner: str, request: v2.SystemSharedMemoryRegisterRequest) -> None:
        if not request.name:
            raise InvalidArgument("name must be set", field="name")
        if (owner, request.name) in self.regions:
            raise InvalidArgument(
                f"region {clip(request.name)!r} is already registered; unregister it first", field="name"
            )
        key = request.key.lstrip("/")
        if not key or "/" in key or key in (".", ".."):
            raise InvalidArgument(
                f"key {clip(request.key)!r} is not a shared-memory object name", field="key"
            )
        if request.byte_size <= 0:
            raise InvalidArgument("byte_size must be > 0", field="byte_size")
        try:
            fd = os.open(self.root / key, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise InvalidArgument(
                f"no shared-memory object {clip(request.key)!r} on this host ({exc.strerror})", field="key"
            ) from exc
        try:
            size = os.fstat(fd).st_size
            if request.offset + request.byte_size > size:
                raise InvalidArgument(
                    f"offset {request.offset} + byte_size {request.byte_size} passes the object's "
                    f"{size} bytes",
                    field="byte_size",
                )
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self.regions[(owner, request.name)] = Region(
            request.name, request.key, request.offset, request.byte_size, mapping
        )

    async def unregister(
        self, request: v2.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> v2.SystemSharedMemoryUnregisterResponse:
        """An empty name unregisters every region of the caller's, as Triton does."""
        owner = _owner()
        names = [request.name] if request.name else [n for o, n in self.regions if o == owner]
        for name in names:
            region = self.regions.pop((owner, name), None)
            if region is not None:
                # A request still reading it holds the mapping: it closes once that request lets go.
                with contextlib.suppress(BufferError):
                    region.mapping.close()
        return v2.SystemSharedMemoryUnregisterResponse()

    async def status(
        self, request: v2.SystemSharedMemoryStatusRequest, context: Context
    ) -> v2.SystemSharedMemoryStatusResponse:
        owner = _owner()
        response = v2.SystemSharedMemoryStatusResponse()
        for (o, name), region in self.regions.items():
            if o == owner and (not request.name or name == request.name):
                status = response.regions[name]
                status.name, status.key = name, region.key
                status.offset, status.byte_size = region.offset, region.byte_size
        if request.name and not response.regions:
            error = InvalidArgument(
                f"no shared memory region {clip(request.name)!r} is registered", field="name"
            )
            await abort(context, error)
            raise error
        return response


def _owner() -> str:
    tenant = CALLER.get()
    return tenant.name if tenant is not None else ""
