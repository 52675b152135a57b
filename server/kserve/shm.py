"""SharedMemory: the protocol's system shared memory extension, off unless the server starts with
--kserve-shm. A caller on the same host (server/kserve/peers.py) registers a POSIX shared-memory object of
its own (server/kserve/shm_objects.py) under a name, then sends inputs by reference: the request carries
the region, offset and size, and the server copies the bytes from the object, so a large input is never
serialised into the message and a truncated object fails only the request that reads it.

Regions belong to the caller that registered them: its tenant when the server checks tokens (--auth-keys),
else the one anonymous caller. Another tenant's region is unknown to a caller (its name is not revealed);
an unregistered region, or bytes outside the registered span or the object, are INVALID_ARGUMENT. Each
caller holds at most --kserve-shm-max-regions regions and --kserve-shm-max-bytes bytes of them
(RESOURCE_EXHAUSTED, SHM_QUOTA); a remote caller is PERMISSION_DENIED (SHM_NOT_LOCAL), as is an object
outside its name prefix (SHM_KEY_NOT_ALLOWED); with the extension off every RPC is UNIMPLEMENTED."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.admission.handlers import Context, abort
from server.admission.tenants import CALLER, Keys
from server.config import Settings
from server.errors import FeatureOff, InvalidArgument, PermissionDenied, SluiceError, TenantQuota, clip
from server.kserve.peers import remote_address
from server.kserve.requests import ReadRegion
from server.kserve.shm_objects import SharedObject, check_tenants, open_object
from wire.errors import SHM_NOT_LOCAL, SHM_QUOTA

SHM_ROOT = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class ShmLimits:
    """What one caller may hold registered; `enabled` False turns the extension off."""

    enabled: bool = False
    max_regions: int = 16
    max_bytes: int = 1 << 30


@dataclass(slots=True)
class Region:
    name: str
    offset: int
    byte_size: int
    source: SharedObject


class SharedMemory:
    def __init__(self, limits: ShmLimits, *, tenants: Iterable[str] = (), root: Path = SHM_ROOT) -> None:
        """Raises ValueError where a tenant's name cannot give it objects of its own (shm_objects.py)."""
        if limits.enabled:
            check_tenants(tenants)
        self.limits = limits
        self.root = root
        self.regions: dict[tuple[str, str], Region] = {}

    @classmethod
    def of(cls, settings: Settings, keys: Keys | None) -> SharedMemory:
        """The extension as the flags set it, for the keys file's tenants."""
        s = settings
        limits = ShmLimits(s.kserve_shm, s.kserve_shm_max_regions, s.kserve_shm_max_bytes)
        return cls(limits, tenants=[t.name for t in keys.tenants] if keys is not None else ())

    def reader(self, context: Context) -> ReadRegion | None:
        """What decoding reads regions through for this call: None with the extension off; the caller is
        checked only when an input is by reference, so calls that send values pay nothing."""
        if not self.limits.enabled:
            return None
        owner = _owner()

        def read(name: str, offset: int, size: int, path: str) -> memoryview:
            _check_local(context)
            return self.read(owner, name, offset, size, path)

        return read

    def read(self, owner: str, name: str, offset: int, size: int, path: str) -> memoryview:
        """`size` bytes at `offset` within the caller's region `name`, copied from the object."""
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
        data = region.source.read(start, size)
        if data is None:
            raise InvalidArgument(
                f"{path}: region {clip(name)!r} needs bytes {start}..{start + size} of its object, which "
                f"now holds {region.source.current_size()} (truncated since it was registered)",
                field=field,
            )
        return data

    async def register(
        self, request: v2.SystemSharedMemoryRegisterRequest, context: Context
    ) -> v2.SystemSharedMemoryRegisterResponse:
        try:
            self._admit(context)
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
        if request.byte_size <= 0:
            raise InvalidArgument("byte_size must be > 0", field="byte_size")
        held = [r for (o, _), r in self.regions.items() if o == owner]
        limits = self.limits
        if len(held) + 1 > limits.max_regions or sum(r.byte_size for r in held) + request.byte_size > (
            limits.max_bytes
        ):
            raise TenantQuota(
                f"registering {request.byte_size} bytes would pass this caller's shared memory cap: it "
                f"holds {len(held)} regions of {sum(r.byte_size for r in held)} bytes, at most "
                f"{limits.max_regions} regions and {limits.max_bytes} bytes (unregister some first)",
                reason=SHM_QUOTA,
                metadata={"max_regions": limits.max_regions, "max_bytes": limits.max_bytes},
            )
        source = open_object(self.root, request.key, owner)
        if request.offset + request.byte_size > source.size:
            source.close()
            raise InvalidArgument(
                f"offset {request.offset} + byte_size {request.byte_size} passes the object's "
                f"{source.size} bytes",
                field="byte_size",
            )
        self.regions[(owner, request.name)] = Region(request.name, request.offset, request.byte_size, source)

    async def unregister(
        self, request: v2.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> v2.SystemSharedMemoryUnregisterResponse:
        """An empty name unregisters every region of the caller's, as Triton does."""
        try:
            self._admit(context)
        except SluiceError as error:
            await abort(context, error)
            raise
        owner = _owner()
        names = [request.name] if request.name else [n for o, n in self.regions if o == owner]
        for name in names:
            region = self.regions.pop((owner, name), None)
            if region is not None:
                # Reads run on the event loop, between awaits: none holds the descriptor now.
                region.source.close()
        return v2.SystemSharedMemoryUnregisterResponse()

    async def status(
        self, request: v2.SystemSharedMemoryStatusRequest, context: Context
    ) -> v2.SystemSharedMemoryStatusResponse:
        try:
            self._admit(context)
            return self._status(_owner(), request)
        except SluiceError as error:
            await abort(context, error)
            raise

    def _status(
        self, owner: str, request: v2.SystemSharedMemoryStatusRequest
    ) -> v2.SystemSharedMemoryStatusResponse:
        response = v2.SystemSharedMemoryStatusResponse()
        for (o, name), region in self.regions.items():
            if o == owner and (not request.name or name == request.name):
                status = response.regions[name]
                status.name, status.key = name, region.source.key
                status.offset, status.byte_size = region.offset, region.byte_size
        if request.name and not response.regions:
            raise InvalidArgument(
                f"no shared memory region {clip(request.name)!r} is registered", field="name"
            )
        return response

    def _admit(self, context: Context) -> None:
        if not self.limits.enabled:
            raise FeatureOff(
                "system shared memory is off on this server; start it with --kserve-shm to serve callers "
                "on its host"
            )
        _check_local(context)


def _check_local(context: Context) -> None:
    peer = getattr(context, "peer", None)  # a front end's forwarded call carries no peer: not provably local
    remote = remote_address(peer() if peer is not None else None, context.invocation_metadata() or ())
    if remote is not None:
        raise PermissionDenied(
            f"shared memory is served only to callers on the server's host (loopback or a Unix socket); "
            f"this call comes from {clip(remote)}",
            reason=SHM_NOT_LOCAL,
            metadata={"peer": remote},
        )


def _owner() -> str:
    tenant = CALLER.get()
    return tenant.name if tenant is not None else ""
