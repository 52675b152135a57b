"""The keys file (--auth-keys) and the one way a presented token is matched against it.

The file is TOML, one [[tenant]] table per caller:

    [[tenant]]
    name = "search"                 # a bounded metric label: the file's names, nothing a caller sends
    token_sha256 = "9f86d0...e4f"   # sha256 of the bearer token, hex (the token itself is never stored)
    priority_ceiling = "normal"     # a request asking for more is served at this (low, normal, high)
    share = 0.5                     # of each model's slots, in flight and waiting together
    rate_per_s = 100                # requests per second, a token bucket holding one second's worth
    models = ["mlp", "byte-lm"]     # optional: absent, every model (a LoRA adapter by its own name)
    admin = true                    # optional: may load and unload LoRA adapters (default false)

A presented token is hashed and compared with every entry in constant time (hmac.compare_digest), so the
time a wrong token takes says nothing about the right ones. Tokens never reach a log or an error.
A token's hash: `printf %s "$TOKEN" | sha256sum`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PRIORITIES = ("low", "normal", "high")


@dataclass(frozen=True, slots=True)
class TenantEntry:
    name: str
    token_sha256: bytes
    priority_ceiling: str
    share: float
    rate_per_s: float
    models: frozenset[str] | None
    # The prefix cache's namespace: tenants never see each other's cached prompts unless their entries
    # name the same `prefix_cache_group`; by default each tenant is its own.
    cache_salt: str = ""
    # May load and unload LoRA adapters at run time (LoadLoraAdapter, POST /v1/load_lora_adapter).
    admin: bool = False


def load_keys(path: Path) -> list[TenantEntry]:
    """The file's tenants; raises ValueError naming the setting and the entry where it cannot serve."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"invalid setting auth_keys: {path}: {exc}") from exc
    entries = document.get("tenant")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"invalid setting auth_keys: {path} holds no [[tenant]] entries")
    tenants = [_entry(entry, index, path) for index, entry in enumerate(entries)]
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"invalid setting auth_keys: {path}: tenant names repeat")
    return tenants


def bearer_token(header: str | None) -> str | None:
    """The token of an `authorization: Bearer <token>` value, or None."""
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def match(entries: Sequence[TenantEntry], token: str) -> TenantEntry | None:
    """The entry whose hash is the token's; every entry is compared, whichever matches."""
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
    found = None
    for entry in entries:
        if hmac.compare_digest(digest, entry.token_sha256):
            found = entry
    return found


def _entry(entry: object, index: int, path: Path) -> TenantEntry:
    where = f"invalid setting auth_keys: {path}: tenant {index + 1}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not a table")
    try:
        name = str(entry["name"])
        digest = bytes.fromhex(str(entry["token_sha256"]))
        ceiling = str(entry.get("priority_ceiling", "normal")).lower()
        share = float(entry.get("share", 1.0))
        rate = float(entry.get("rate_per_s", math.inf))
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"{where} needs name, token_sha256 (64 hex digits), and optionally priority_ceiling "
            f"(low, normal, high), share, rate_per_s, models, prefix_cache_group "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if len(digest) != 32 or ceiling not in PRIORITIES or not 0 < share <= 1 or not rate > 0:
        raise ValueError(
            f"{where}: token_sha256 must be 64 hex digits, priority_ceiling low, normal or high, "
            "share in (0, 1], rate_per_s > 0"
        )
    models = entry.get("models")
    if not isinstance(entry.get("admin", False), bool):
        raise ValueError(f"{where}: admin must be true or false")
    return TenantEntry(
        name=name,
        token_sha256=digest,
        priority_ceiling=ceiling,
        share=share,
        rate_per_s=rate,
        models=frozenset(str(m) for m in models) if isinstance(models, list) else None,
        cache_salt="group:" + str(entry["prefix_cache_group"])
        if "prefix_cache_group" in entry
        else "tenant:" + name,
        admin=entry.get("admin", False),
    )
