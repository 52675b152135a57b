"""The keys file and a tenant's quotas (issue 11, points 2-3): constant-time token lookup, the rate's token
bucket on an injected clock, the share of a gate, and the file's mistakes named before the server binds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from server.admission.tenants import Keys
from server.domain import Priority
from server.errors import PermissionDenied, TenantQuota, Unauthenticated


def keys_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(body)
    return path


def one_tenant(tmp_path: Path, **fields: object) -> Keys:
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in fields.items())
    digest = hashlib.sha256(b"s3cret").hexdigest()
    return Keys.load(keys_file(tmp_path, f'[[tenant]]\nname = "t"\ntoken_sha256 = "{digest}"\n{extra}'))


def test_bearer_tokens_are_matched_by_their_hash(tmp_path: Path) -> None:
    keys = one_tenant(tmp_path, priority_ceiling="low")
    tenant = keys.authenticate({"authorization": "Bearer s3cret"})
    assert tenant.name == "t" and tenant.priority_ceiling is Priority.LOW
    for metadata in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic s3cret"}):
        with pytest.raises(Unauthenticated) as refused:
            keys.authenticate(metadata)
        assert "s3cret" not in refused.value.message


def test_the_rate_is_a_token_bucket_of_one_second(tmp_path: Path) -> None:
    tenant = one_tenant(tmp_path, rate_per_s=2.0).tenants[0]
    now = tenant.refilled
    tenant.take("m", 100, now)
    tenant.take("m", 100, now)
    with pytest.raises(TenantQuota) as over:
        tenant.take("m", 100, now)
    assert over.value.retry_after_s == pytest.approx(0.5) and over.value.metadata["limit"] == "rate_per_s"
    tenant.take("m", 100, now + 0.5)  # half a second refills one


def test_a_rate_under_one_a_second_still_lets_one_call_through(tmp_path: Path) -> None:
    # Also a replica's fallback share of a fleet-wide rate (R / replicas, server/admission/fleet_rates.py).
    tenant = one_tenant(tmp_path, rate_per_s=0.5).tenants[0]
    now = tenant.refilled + 2.0
    tenant.take("m", 100, now)
    with pytest.raises(TenantQuota) as over:
        tenant.take("m", 100, now + 1.0)
    assert over.value.retry_after_s == pytest.approx(1.0)
    tenant.take("m", 100, now + 2.0)


def test_the_share_counts_what_the_tenant_holds_of_a_gate(tmp_path: Path) -> None:
    tenant = one_tenant(tmp_path, share=0.25).tenants[0]
    now = tenant.refilled
    for _ in range(2):
        tenant.take("m", 8, now)
    with pytest.raises(TenantQuota):
        tenant.take("m", 8, now)
    tenant.take("other", 8, now)  # another model's gate is another share
    tenant.release("m")
    tenant.take("m", 8, now)


def test_models_are_a_tenants_allow_list(tmp_path: Path) -> None:
    tenant = one_tenant(tmp_path, models=["mlp"]).tenants[0]
    tenant.check_model("mlp")
    with pytest.raises(PermissionDenied):
        tenant.check_model("byte-lm")


@pytest.mark.parametrize(
    "body",
    [
        "not toml = = =",
        "[other]\nx = 1\n",
        '[[tenant]]\nname = "t"\n',
        '[[tenant]]\nname = "t"\ntoken_sha256 = "abc"\n',
        f'[[tenant]]\nname = "t"\ntoken_sha256 = "{"0" * 64}"\nshare = 2\n',
        f'[[tenant]]\nname = "t"\ntoken_sha256 = "{"0" * 64}"\npriority_ceiling = "urgent"\n',
    ],
)
def test_a_mistake_in_the_file_names_the_setting(tmp_path: Path, body: str) -> None:
    with pytest.raises(ValueError, match="invalid setting auth_keys"):
        Keys.load(keys_file(tmp_path, body))


def test_each_tenant_has_its_own_prefix_cache_unless_the_file_groups_them(tmp_path: Path) -> None:
    """Issue 19: the prefix cache's salt is the tenant's, or its `prefix_cache_group`'s."""
    digest = hashlib.sha256(b"s3cret").hexdigest()
    entries = "".join(
        f'[[tenant]]\nname = "{name}"\ntoken_sha256 = "{digest[:-2]}{index:02x}"\n{group}'
        for index, (name, group) in enumerate(
            [
                ("a", ""),
                ("b", ""),
                ("c", 'prefix_cache_group = "team"\n'),
                ("d", 'prefix_cache_group = "team"\n'),
            ]
        )
    )
    salts = {t.name: t.entry.cache_salt for t in Keys.load(keys_file(tmp_path, entries)).tenants}
    assert salts["a"] != salts["b"] and salts["c"] == salts["d"] != salts["a"]
    assert salts["a"] != "group:a"  # a tenant named like a group still sees only its own
