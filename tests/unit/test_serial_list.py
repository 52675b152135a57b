"""Issue 34, item 6: the parallel pass writes the node ids of the tests marked serial (--serial-list), and
`pytest @LIST` runs those and collects no other module; a selection without one is refused, never an empty
list (with which `pytest @LIST` would run the whole suite). An inner pytest run (pytester)."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)

TIMED = """
import pytest

@pytest.mark.serial
@pytest.mark.parametrize("size", [1, 2])
def test_timed(size):
    pass

def test_plain():
    pass
"""
# A module the serial pass must not import: importing it fails.
OTHER = "raise RuntimeError('the serial pass imported a module without serial tests')\n"


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\nmarkers =\n    serial: compares wall times\n")
    pytester.makepyfile(test_timed=TIMED, test_quick="def test_quick():\n    pass\n")
    return pytester


def test_the_serial_pass_runs_the_listed_tests_alone(inner: pytest.Pytester) -> None:
    listing = inner.path / "serial.txt"
    parallel = inner.runpytest(
        "-p", "tests.support.serial_list", "-m", "not serial", f"--serial-list={listing}"
    )
    parallel.assert_outcomes(passed=2, deselected=2)
    assert listing.read_text().splitlines() == [
        "test_timed.py::test_timed[1]",
        "test_timed.py::test_timed[2]",
    ]
    inner.makepyfile(test_other=OTHER)
    serial = inner.runpytest("-m", "serial", f"@{listing}")
    serial.assert_outcomes(passed=2)


def test_a_selection_without_serial_tests_writes_no_list(inner: pytest.Pytester) -> None:
    listing = inner.path / "serial.txt"
    result = inner.runpytest("-p", "tests.support.serial_list", f"--serial-list={listing}", "test_quick.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no test is marked serial in this selection*"])
    assert not listing.exists()
