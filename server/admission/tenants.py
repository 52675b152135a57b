"""Tenants at admission: who a call's token names (auth/keys.py reads the file), and what that tenant may
still take: its models, its priority ceiling, its share of each model's gate and its request rate."""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from auth.keys import TenantEntry, bearer_token, load_keys, match
from server.errors import PermissionDenied, TenantQuota, Unauthenticated, clip
from server.priority import Priority
from wire import metadata as metadata_names

if TYPE_CHECKING:
    from server.admission.fleet_rates import FleetRates

AUTHORIZATION = metadata_names.AUTHORIZATION
TENANT_KEY = metadata_names.TENANT

# The calling tenant, set from the metadata as the call starts and read by the deserializer (which refuses
# a model the tenant may not call), by admission (ceiling, share, rate) and the access log: a task per call.
CALLER: contextvars.ContextVar[Tenant | None] = contextvars.ContextVar("tenant", default=None)
_PRIORITIES = {"low": Priority.LOW, "normal": Priority.NORMAL, "high": Priority.HIGH}


@dataclass(eq=False, slots=True)
class Tenant:
    """A keys-file entry (name, share, rate, models) and what it holds now."""

    entry: TenantEntry
    priority_ceiling: Priority
    # The token bucket, and what the tenant holds of each model's gate (in flight + waiting).
    tokens: float = 0.0
    refilled: float = 0.0
    holding: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def share(self) -> float:
        return self.entry.share

    @property
    def rate_per_s(self) -> float:
        return self.entry.rate_per_s

    @property
    def models(self) -> frozenset[str] | None:
        return self.entry.models

    def check_model(self, model: str) -> None:
        if self.models is not None and model not in self.models:
            raise PermissionDenied(
                f"tenant {self.name!r} may not call model {clip(model)!r}",
                metadata={"tenant": self.name, "model": model},
            )

    def take(self, model: str, slots: int, now: float, fleet: FleetRates | None = None) -> None:
        """Counts one call against the tenant's rate and its share of `model`'s `slots` (raising
        TenantQuota, before it queues); release() gives the share back. With `fleet` (--tenant-store) the
        rate is counted across the replicas, or against this replica's share of it while the store is down."""
        if fleet is not None and math.isfinite(self.rate_per_s):
            held = self._check_share(model, slots)  # first: a refused share must not spend a fleet token
            wait = fleet.take(self.name, self.rate_per_s)
            if wait is None:
                self._take_local(fleet.local_rate(self.rate_per_s), now, spend=True)
            elif wait > 0:
                raise self._over_rate(self.rate_per_s, wait)
            self.holding[model] = held + 1
            return
        limited = math.isfinite(self.rate_per_s)
        if limited:
            self._take_local(self.rate_per_s, now, spend=False)
        held = self._check_share(model, slots)
        if limited:
            self.tokens -= 1.0
        self.holding[model] = held + 1

    def _take_local(self, rate: float, now: float, *, spend: bool) -> None:
        """This replica's bucket at `rate`, holding at most `rate` tokens (one, for a share under 1/s):
        refilled, then a token checked (and spent if `spend`)."""
        self.tokens = min(max(1.0, rate), self.tokens + (now - self.refilled) * rate)
        self.refilled = now
        if self.tokens < 1.0:
            raise self._over_rate(rate, (1.0 - self.tokens) / rate)
        if spend:
            self.tokens -= 1.0

    def _over_rate(self, rate: float, wait: float) -> TenantQuota:
        return TenantQuota(
            f"tenant {self.name!r} is over its rate of {rate:g} requests/s",
            metadata={"tenant": self.name, "limit": "rate_per_s"},
            retry_after_s=round(max(wait, 0.001), 3),
        )

    def _check_share(self, model: str, slots: int) -> int:
        """What the tenant holds of `model`, raising TenantQuota where that is its whole share."""
        cap = max(1, math.floor(self.share * slots))
        held = self.holding.get(model, 0)
        if held >= cap:
            raise TenantQuota(
                f"tenant {self.name!r} holds its share of {model}: {held} of {slots} slots",
                metadata={"tenant": self.name, "limit": "share", "share_slots": cap},
                retry_after_s=0.1,
            )
        return held

    def release(self, model: str) -> None:
        self.holding[model] -= 1


class Keys:
    """The tenants of one keys file."""

    def __init__(self, tenants: list[Tenant], clock: Callable[[], float] = time.monotonic) -> None:
        self.tenants = tenants
        self._entries = [t.entry for t in tenants]  # what a presented token is matched against
        self._by_name = {t.name: t for t in tenants}  # names are unique in a keys file
        self.clock = clock
        now = clock()
        for tenant in tenants:
            tenant.tokens, tenant.refilled = tenant.rate_per_s, now

    @classmethod
    def load(cls, path: Path) -> Keys:
        """Raises ValueError naming the setting and the entry where the file cannot serve."""
        return cls([_tenant(entry) for entry in load_keys(path)])

    def authenticate(self, metadata: Mapping[str, str]) -> Tenant:
        """The tenant whose token the call presents (`authorization: Bearer ...`), or Unauthenticated."""
        header = metadata.get(AUTHORIZATION)
        if header is None:
            raise Unauthenticated("this server needs `authorization: Bearer <token>` metadata")
        token = bearer_token(header)
        if token is None:
            raise Unauthenticated("the authorization metadata must be `Bearer <token>`")
        entry = match(self._entries, token)
        if entry is None:
            raise Unauthenticated("the token is not one this server knows")
        return self._by_name[entry.name]


def _tenant(entry: TenantEntry) -> Tenant:
    return Tenant(entry=entry, priority_ceiling=_PRIORITIES[entry.priority_ceiling])
