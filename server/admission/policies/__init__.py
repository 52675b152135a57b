"""Admission policies, one file each, and their registration: the list the interceptor runs by default, and
the settings they declare. A new policy is a file here and one line in POLICIES (its order is its place in
the list); a policy that declares settings (a PolicySettingsBase dataclass in its file, each field a flag of
`sluice serve`) also names them among PolicySettings' bases, which the server's Settings inherits."""

from __future__ import annotations

from dataclasses import dataclass

from server.admission.policies.authentication import Authentication
from server.admission.policies.lifecycle import Lifecycle
from server.admission.policies.memory import MemoryGuard
from server.admission.policies.models import KnownModel
from server.admission.policies.queue import QueueBound
from server.admission.policies.request_bytes import RequestBytes, RequestBytesSettings
from server.admission.policies.tenant_limits import TenantLimits, TenantLimitsSettings
from server.admission.policy import AdmissionPolicy
from server.admission.policy_context import PolicyContext

__all__ = ["POLICIES", "Lifecycle", "PolicySettings", "default_policies"]

# In the order their refusals take precedence.
POLICIES: tuple[type[AdmissionPolicy], ...] = (
    Authentication,
    Lifecycle,
    KnownModel,
    TenantLimits,
    MemoryGuard,
    QueueBound,
    RequestBytes,
)


@dataclass(frozen=True, kw_only=True)
class PolicySettings(RequestBytesSettings, TenantLimitsSettings):
    """Every policy's declared settings, as one base of the server's Settings (server/config.py)."""


def default_policies(settings: PolicySettings, context: PolicyContext) -> list[AdmissionPolicy]:
    """The registered policies built from their settings and the server's objects, less those left out."""
    built = [policy.build(settings, context) for policy in POLICIES]
    return [policy for policy in built if policy is not None]
