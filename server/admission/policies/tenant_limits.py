"""TenantLimits: what the calling tenant may take (server/admission/tenants.py): its models (before the call
is parsed), its priority ceiling, its share of the model's gate and its rate (before it queues, given back
with the slot). Counted per tenant in sluice_tenant_requests_total.

Rates are per replica unless `--tenant-store` names a Redis that holds them for the fleet
(server/admission/fleet_rates.py). Shares need no store: a share is a fraction of each replica's slots, so
of the fleet's too."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from process.flags import setting
from server.admission.fleet_rates import FleetRates
from server.admission.policy import Admission, AdmissionPolicy, Release
from server.admission.policy_context import PolicyContext, PolicySettingsBase, check_setting
from server.admission.tenants import CALLER, Keys
from server.errors import SluiceError

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod
    from server.metrics import Metrics


@dataclass(frozen=True, kw_only=True)
class TenantLimitsSettings(PolicySettingsBase):
    tenant_store: str | None = setting(
        None,
        help="Redis holding tenants' rates for the fleet (redis://host:port/db, unix:///path.sock); "
        "unreachable: each replica allows its share",
        shown="rates per replica",
    )
    tenant_store_timeout_s: float = setting(
        0.05,
        help="how long a call waits for the tenant store before its replica decides alone",
        unit="seconds",
    )

    def __post_init__(self) -> None:
        store = self.tenant_store
        check_setting(
            store is None or store.startswith(("redis://", "rediss://", "unix://")),
            "tenant_store",
            "must be a redis://, rediss:// or unix:// URL",
        )
        check_setting(self.tenant_store_timeout_s > 0, "tenant_store_timeout_s", "must be > 0")
        super().__post_init__()


class TenantLimits(AdmissionPolicy):
    def __init__(self, keys: Keys, metrics: Metrics, fleet: FleetRates | None = None) -> None:
        self.keys = keys
        self.metrics = metrics
        self.fleet = fleet

    @classmethod
    def build(cls, settings: TenantLimitsSettings, context: PolicyContext) -> TenantLimits | None:
        if context.keys is None:
            return None
        fleet = None
        if settings.tenant_store is not None:
            fleet = FleetRates(
                settings.tenant_store, context.metrics, timeout_s=settings.tenant_store_timeout_s
            )
        return cls(context.keys, context.metrics, fleet)

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
        tenant.take(admission.model, admission.gate.slots, self.keys.clock(), self.fleet)  # before it queues
        return functools.partial(tenant.release, admission.model)

    def settle(self, admission: Admission, error: SluiceError | None) -> None:
        if (tenant := CALLER.get()) is not None:
            self.metrics.tenant_calls.labels(tenant.name, "admitted" if error is None else error.reason).inc()
