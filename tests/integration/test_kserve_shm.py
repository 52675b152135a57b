"""Issue 21, acceptance 3: system shared memory through unchanged tritonclient (.venv-triton). A tenant's
region carries a 4 MiB input by reference with the same output as by value; a 64 MiB input, over the
message limit by value, works by shared memory; unregistered, another tenant's and out-of-bounds regions
are refused with INVALID_ARGUMENT."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_kserve_tritonclient import run_probe
from tests.support.processes import ServerProcess, start_server

ALPHA, BETA = "alpha-shm-token", "beta-shm-token"


@pytest.fixture(scope="module")
def shm_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        "".join(
            f'[[tenant]]\nname = "{name}"\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n\n'
            for name, token in (("alpha", ALPHA), ("beta", BETA))
        )
    )
    server: ServerProcess = start_server(
        "--plugins", "tests.support.faulty_models", "--models", "vector-sum", "--auth-keys", str(keys),
        "--max-message-bytes", str(8 * 1024 * 1024), "--kserve-shm", "true",
    )  # fmt: skip
    try:
        yield run_probe("shm", server.target, {"alpha": ALPHA, "beta": BETA})
    finally:
        assert server.terminate() == 0


def test_an_input_by_shared_memory_equals_the_same_by_value(shm_run: dict[str, Any]) -> None:
    assert shm_run["status"] == ["in"] and shm_run["beta_status"] == [], "regions are per tenant"
    assert shm_run["y_shm"] == shm_run["y_value"] == shm_run["y_local"]


def test_a_64_mib_input_over_the_message_limit_works_by_shared_memory(shm_run: dict[str, Any]) -> None:
    assert shm_run["large_by_value"]["status"] == "StatusCode.RESOURCE_EXHAUSTED", shm_run["large_by_value"]
    assert shm_run["large_y_shm"] == shm_run["large_y_local"]


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("foreign", "no shared memory region 'in'"),
        ("unregistered", "no shared memory region 'nope'"),
        ("out_of_bounds", "outside region 'in'"),
        ("register_past_end", "passes the object"),
        ("register_twice", "already registered"),
        ("after_unregister", "no shared memory region 'in'"),
    ],
)
def test_bad_regions_are_refused(shm_run: dict[str, Any], case: str, needle: str) -> None:
    error = shm_run[case]
    assert error is not None and error["status"] == "StatusCode.INVALID_ARGUMENT", error
    assert needle in error["message"], error
    assert shm_run["status_after"] == []
