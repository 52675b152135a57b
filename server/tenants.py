"""Tenants from the keys file (--auth-keys): who may call, which models, at what priority, how much.

The file is TOML, one [[tenant]] table per caller:

    [[tenant]]
    name = "search"                 # a bounded metric label: the file's names, nothing a caller sends
    token_sha256 = "9f86d0...e4f"   # sha256 of the bearer token, hex (the token itself is never stored)
    priority_ceiling = "normal"     # a request asking for more is served at this (low, normal, high)
    share = 0.5                     # of each model's slots, in flight and waiting together
    rate_per_s = 100                # requests per second, a token bucket holding one second's worth
    models = ["mlp", "byte-lm"]     # optional: absent, every model

A presented token is hashed and compared with every entry in constant time (hmac.compare_digest), so the
time a wrong token takes says nothing about the right ones. Tokens never reach a log or an error.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from server.domain import Priority
from server.errors import PermissionDenied, TenantQuota, Unauthenticated, clip

AUTHORIZATION = "authorization"
_PRIORITIES = {"low": Priority.LOW, "normal": Priority.NORMAL, "high": Priority.HIGH}


@dataclass(eq=False, slots=True)
class Tenant:
    name: str
    token_sha256: bytes
    priority_ceiling: Priority
    share: float
    rate_per_s: float
    models: frozenset[str] | None
    # The token bucket, and what the tenant holds of each model's gate (in flight + waiting).
    tokens: float = 0.0
    refilled: float = 0.0
    holding: dict[str, int] = field(default_factory=dict)

    def check_model(self, model: str) -> None:
        if self.models is not None and model not in self.models:
            raise PermissionDenied(
                f"tenant {self.name!r} may not call model {clip(model)!r}",
                metadata={"tenant": self.name, "model": model},
            )

    def take(self, model: str, slots: int, now: float) -> None:
        """Counts one call against the tenant's rate and its share of `model`'s `slots` (raising
        TenantQuota, before it queues); release() gives the share back."""
        limited = math.isfinite(self.rate_per_s)
        if limited:
            self.tokens = min(self.rate_per_s, self.tokens + (now - self.refilled) * self.rate_per_s)
            self.refilled = now
        if limited and self.tokens < 1.0:
            wait = (1.0 - self.tokens) / self.rate_per_s
            raise TenantQuota(
                f"tenant {self.name!r} is over its rate of {self.rate_per_s:g} requests/s",
                metadata={"tenant": self.name, "limit": "rate_per_s"},
                retry_after_s=round(max(wait, 0.001), 3),
            )
        cap = max(1, math.floor(self.share * slots))
        held = self.holding.get(model, 0)
        if held >= cap:
            raise TenantQuota(
                f"tenant {self.name!r} holds its share of {model}: {held} of {slots} slots",
                metadata={"tenant": self.name, "limit": "share", "share_slots": cap},
                retry_after_s=0.1,
            )
        if limited:
            self.tokens -= 1.0
        self.holding[model] = held + 1

    def release(self, model: str) -> None:
        self.holding[model] -= 1


class Keys:
    """The tenants of one keys file."""

    def __init__(self, tenants: list[Tenant], clock: Callable[[], float] = time.monotonic) -> None:
        self.tenants = tenants
        self.clock = clock
        now = clock()
        for tenant in tenants:
            tenant.tokens, tenant.refilled = tenant.rate_per_s, now

    @classmethod
    def load(cls, path: Path) -> Keys:
        """Raises ValueError naming the setting and the entry where the file cannot serve."""
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"invalid setting auth_keys: {path}: {exc}") from exc
        entries = document.get("tenant")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"invalid setting auth_keys: {path} holds no [[tenant]] entries")
        tenants = [_tenant(entry, index, path) for index, entry in enumerate(entries)]
        names = [t.name for t in tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"invalid setting auth_keys: {path}: tenant names repeat")
        return cls(tenants)

    def authenticate(self, metadata: Mapping[str, str]) -> Tenant:
        """The tenant whose token the call presents (`authorization: Bearer ...`), or Unauthenticated."""
        header = metadata.get(AUTHORIZATION)
        if header is None:
            raise Unauthenticated("this server needs `authorization: Bearer <token>` metadata")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization metadata must be `Bearer <token>`")
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).digest()
        found = None
        for tenant in self.tenants:  # every entry compared: the time taken does not depend on which matched
            if hmac.compare_digest(digest, tenant.token_sha256):
                found = tenant
        if found is None:
            raise Unauthenticated("the token is not one this server knows")
        return found


def _tenant(entry: object, index: int, path: Path) -> Tenant:
    where = f"invalid setting auth_keys: {path}: tenant {index + 1}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not a table")
    try:
        name = str(entry["name"])
        digest = bytes.fromhex(str(entry["token_sha256"]))
        ceiling = _PRIORITIES[str(entry.get("priority_ceiling", "normal")).lower()]
        share = float(entry.get("share", 1.0))
        rate = float(entry.get("rate_per_s", math.inf))
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"{where} needs name, token_sha256 (64 hex digits), and optionally priority_ceiling "
            f"(low, normal, high), share, rate_per_s, models ({type(exc).__name__}: {exc})"
        ) from exc
    if len(digest) != 32 or not 0 < share <= 1 or not rate > 0:
        raise ValueError(f"{where}: token_sha256 must be 64 hex digits, share in (0, 1], rate_per_s > 0")
    models = entry.get("models")
    return Tenant(
        name=name,
        token_sha256=digest,
        priority_ceiling=ceiling,
        share=share,
        rate_per_s=rate,
        models=frozenset(str(m) for m in models) if isinstance(models, list) else None,
    )
