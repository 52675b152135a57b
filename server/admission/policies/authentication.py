"""Authentication: a call must present a token the keys file knows; checked on its metadata alone, before
its bytes are read. The tenant it names is the call's CALLER from then on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from server.admission.policy import AdmissionPolicy
from server.admission.policy_context import PolicyContext
from server.admission.tenants import CALLER, Keys
from server.errors import SluiceError

if TYPE_CHECKING:
    from server.metrics import Metrics

# Health and reflection answer without a token: load balancers and grpcurl's discovery need them.
# and so do the v2 server-level probes (ServerLive, ServerReady, ServerMetadata), as KServe probes them.
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.", "/inference.GRPCInferenceService/Server")


class Authentication(AdmissionPolicy):
    def __init__(self, keys: Keys, metrics: Metrics) -> None:
        self.keys = keys
        self.metrics = metrics

    @classmethod
    def build(cls, settings: object, context: PolicyContext) -> Authentication | None:
        """In effect with --auth-keys (a server setting: KServe's shared memory reads the tenants too)."""
        return cls(context.keys, context.metrics) if context.keys is not None else None

    def screen(self, path: str, metadata: Mapping[str, str]) -> SluiceError | None:
        if path.startswith(OPEN_PREFIXES):
            return None
        try:
            CALLER.set(self.keys.authenticate(metadata))
        except SluiceError as error:
            self.metrics.refused.labels("", path.rpartition("/")[2], error.reason).inc()
            return error
        return None
