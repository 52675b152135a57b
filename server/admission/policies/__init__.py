"""Admission policies, one file each, and the list the interceptor runs by default: a new policy is a file
here and one line in `default_policies` (its order is its place in the list)."""

from __future__ import annotations

from server.admission.policies.authentication import Authentication
from server.admission.policies.lifecycle import Lifecycle
from server.admission.policies.memory import MemoryGuard
from server.admission.policies.models import KnownModel
from server.admission.policies.queue import QueueBound
from server.admission.policies.request_bytes import RequestBytes
from server.admission.policies.tenant_limits import TenantLimits
from server.admission.policy import AdmissionPolicy
from server.admission.tenants import Keys
from server.memory.breaker import MemoryBreaker
from server.metrics import Metrics

__all__ = ["Lifecycle", "default_policies"]


def default_policies(
    *,
    lifecycle: Lifecycle,
    metrics: Metrics,
    keys: Keys | None,
    breaker: MemoryBreaker | None,
    max_request_bytes: int | None,
) -> list[AdmissionPolicy]:
    """In the order their refusals take precedence."""
    optional: list[AdmissionPolicy | None] = [
        Authentication(keys, metrics) if keys is not None else None,
        lifecycle,
        KnownModel(),
        TenantLimits(keys, metrics) if keys is not None else None,
        MemoryGuard(breaker) if breaker is not None else None,
        QueueBound(),
        RequestBytes(max_request_bytes) if max_request_bytes else None,
    ]
    return [policy for policy in optional if policy is not None]
