"""Which skips a run accepts: under `make test` (CI=true) a test skipped for a missing tool or package fails,
naming it, and only a skip for absent hardware (a CUDA device, an IPv6 loopback, a descriptor limit) stays a
skip. A pytest plugin; tests/conftest.py loads it.

Why CI=true and not every run: `make test` sets it after scripts/setup_test_tools.sh has installed every
tool, so there a skip is a set-up that failed quietly; a developer running a few modules on a laptop without
Chromium keeps the skip and its reason. SLUICE_STRICT_SKIPS=1 (or 0) decides it explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping
from typing import NoReturn

import pytest

# A skip whose reason begins with this is one the machine's hardware or kernel decides; set-up cannot fix it.
HARDWARE = "hardware: "
STRICT = pytest.StashKey[bool]()
TRUE = {"1", "true", "yes", "on"}


def strict(env: Mapping[str, str]) -> bool:
    """Whether a skip for a missing tool fails the run (see the module docstring)."""
    explicit = env.get("SLUICE_STRICT_SKIPS", "").strip().lower()
    if explicit:
        return explicit in TRUE
    return env.get("CI", "").strip().lower() in TRUE


def skip_for_hardware(reason: str) -> NoReturn:
    """Skip a test because this machine lacks a device or kernel feature, which no set-up step installs."""
    pytest.skip(HARDWARE + reason)


def hardware_mark(condition: bool, reason: str) -> pytest.MarkDecorator:
    """`pytest.mark.skipif` for a hardware condition: a skip the strict run accepts."""
    return pytest.mark.skipif(condition, reason=HARDWARE + reason)


def skip_reason(longrepr: object) -> str:
    """The reason a skipped report gives (pytest keeps it as (path, line, "Skipped: reason"))."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


def refusal(reason: str) -> str | None:
    """The failure a strict run reports for a skip with this reason; None where the skip stands."""
    if reason.startswith(HARDWARE):
        return None
    return (
        f"skipped, but CI=true (make test) runs every suite: {reason}\n"
        "Install what it names (`make test-tools` runs scripts/setup_test_tools.sh), or set "
        "SLUICE_STRICT_SKIPS=0 to let it skip."
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[STRICT] = strict(os.environ)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, object, object]:
    report = yield
    assert isinstance(report, pytest.TestReport)
    # An expected failure is reported as skipped too; it is no missing tool.
    if not report.skipped or hasattr(report, "wasxfail") or not item.config.stash.get(STRICT, False):
        return report
    if item.get_closest_marker("cuda") is not None:
        return report
    failure = refusal(skip_reason(report.longrepr))
    if failure is not None:
        report.outcome = "failed"
        report.longrepr = failure
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, object, object]:
    """A module skipped whole (`pytest.importorskip` of a package the lock pins) fails its collection."""
    report = yield
    assert isinstance(report, pytest.CollectReport)
    if report.skipped and collector.config.stash.get(STRICT, False):
        failure = refusal(skip_reason(report.longrepr))
        if failure is not None:
            report.outcome = "failed"
            report.longrepr = failure
    return report
