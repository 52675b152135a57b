"""TenantLimits: what the calling tenant may take (server/admission/tenants.py): its models (before the call
is parsed), its priority ceiling, its share of the model's gate and its rate (before it queues, given back
with the slot). Counted per tenant in sluice_tenant_requests_total."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from server.admission.policy import Admission, AdmissionPolicy, Release
from server.admission.policy_context import PolicyContext
from server.admission.tenants import CALLER, Keys
from server.errors import SluiceError

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod
    from server.metrics import Metrics


class TenantLimits(AdmissionPolicy):
    def __init__(self, keys: Keys, metrics: Metrics) -> None:
        self.keys = keys
        self.metrics = metrics

    @classmethod
    def build(cls, settings: object, context: PolicyContext) -> TenantLimits | None:
        return cls(context.keys, context.metrics) if context.keys is not None else None

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        tenant = CALLER.get()
        if tenant is None:
            return None
        try:
            tenant.check_model(model)
        except SluiceError as error:
            self.metrics.tenant_calls.labels(tenant.name, error.reason).inc()
            return error
        return None

    def hold(self, admission: Admission) -> Release | None:
        tenant = CALLER.get()
        if tenant is None:
            return None
        admission.priority = min(admission.priority, tenant.priority_ceiling)
        tenant.take(admission.model, admission.gate.slots, self.keys.clock())  # before it queues
        return functools.partial(tenant.release, admission.model)

    def settle(self, admission: Admission, error: SluiceError | None) -> None:
        if (tenant := CALLER.get()) is not None:
            self.metrics.tenant_calls.labels(tenant.name, "admitted" if error is None else error.reason).inc()
