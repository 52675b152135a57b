"""Issue 36, item 7: under `make test` (CI=true) a test skipped for a missing tool fails, naming the tool;
skips for absent hardware (CUDA, IPv6), expected failures and other runs stay as they were. An inner pytest
run (pytester) with the plugin tests/conftest.py loads."""

from __future__ import annotations

import os

import pytest

from tests.support.processes import ROOT
from tests.support.skips import HARDWARE, refusal, skip_reason, strict

pytest_plugins = ("pytester",)

MODULE = """
import pytest
from tests.support.skips import hardware_mark, skip_for_hardware

@pytest.mark.skipif(True, reason="node or clients/node/node_modules missing")
def test_needs_node():
    pass

def test_needs_chromium():
    pytest.skip("chromium (Debian) is not installed")

@pytest.mark.cuda
def test_on_a_gpu():
    pytest.skip("needs a CUDA device")

def test_without_ipv6():
    skip_for_hardware("no IPv6 loopback here")

@hardware_mark(True, "no IPv6")
def test_marked_without_ipv6():
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False

def test_plain():
    pass
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in ("CI", "SLUICE_STRICT_SKIPS"):
        monkeypatch.delenv(name, raising=False)
    # The inner run starts in a temporary folder: the repository must be on its path to load the plugin.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makeini("[pytest]\nmarkers =\n    cuda: needs a CUDA device\n")
    absent = "import pytest\npytest.importorskip('sluice_absent_pkg')\n"
    pytester.makepyfile(test_tools=MODULE, test_no_package=absent)
    return pytester


def test_under_ci_a_missing_tool_fails_naming_it(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    # A module skipped whole fails its collection, which stops a run; this one goes on to show the rest.
    flags = ("-p", "tests.support.skips", "-p", "no:cacheprovider", "--continue-on-collection-errors")
    result = inner.runpytest_subprocess(*flags)
    # A skip mark acts in the set-up phase, so that refusal is reported as an error; pytest.skip as a failure.
    result.assert_outcomes(passed=1, failed=1, skipped=3, xfailed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*CI=true (make test) runs every suite: node or clients/node/node_modules missing*",
            "*CI=true (make test) runs every suite: chromium (Debian) is not installed*",
            "*CI=true (make test) runs every suite: could not import 'sluice_absent_pkg'*",
        ]
    )


@pytest.mark.parametrize("env", [{}, {"CI": "true", "SLUICE_STRICT_SKIPS": "0"}, {"CI": "false"}])
def test_elsewhere_the_same_tests_skip(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = inner.runpytest_subprocess("-p", "tests.support.skips", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=6, xfailed=1)


def test_the_switch() -> None:
    assert strict({"CI": "true"}) and strict({"CI": "1"}) and strict({"SLUICE_STRICT_SKIPS": "1"})
    assert not strict({}) and not strict({"CI": "false"})
    assert not strict({"CI": "true", "SLUICE_STRICT_SKIPS": "0"})


def test_a_hardware_reason_stands_and_any_other_is_refused() -> None:
    assert skip_reason(("x.py", 3, "Skipped: promtool is absent")) == "promtool is absent"
    assert refusal(HARDWARE + "needs a CUDA device") is None
    failure = refusal("promtool is absent")
    assert failure is not None and "promtool is absent" in failure and "make test-tools" in failure
