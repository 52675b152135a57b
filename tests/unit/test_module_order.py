"""tests/support/module_order.py: modules longest first by the recorded seconds, each module's tests kept
together and in order, an unrecorded module counted as the median; the record is made from a junit file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import module_order


@dataclass
class Item:
    nodeid: str


def test_modules_run_longest_first_and_keep_their_tests_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "module_seconds.txt"
    record.write_text("# header\n90.0 tests/b.py\n10.0 tests/a.py\n50.0 tests/c.py\n")
    monkeypatch.setattr(module_order, "RECORD", record)
    names = ["tests/a.py::x", "tests/a.py::y", "tests/new.py::z", "tests/b.py::x", "tests/c.py::y"]
    items: list[Any] = [Item(name) for name in names]
    module_order.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    # new.py counts as the median, 50, as c.py does: a tie keeps the order of collection.
    assert [i.nodeid for i in items] == [
        "tests/b.py::x", "tests/new.py::z", "tests/c.py::y", "tests/a.py::x", "tests/a.py::y",
    ]  # fmt: skip


def test_the_record_sums_each_modules_tests_from_a_junit_file(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.integration.test_x" name="a" time="1.5"/>'
        '<testcase classname="tests.integration.test_x.TestGroup" name="b" time="2.0"/>'
        '<testcase classname="tests.unit.test_y" name="c" time="0.25"/>'
        "</testsuite></testsuites>"
    )
    assert module_order.from_junit(junit) == {
        "tests/integration/test_x.py": 3.5,
        "tests/unit/test_y.py": 0.25,
    }
