"""The test modules in the order of their recorded wall times, longest first (tests/module_seconds.txt), so
the parallel pass (`--dist loadfile --no-loadscope-reorder`) hands the long modules out first and ends on
short ones, not with one long module running alone while the other worker idles. A pytest plugin;
tests/conftest.py loads it. Tests keep their order inside a module; a module not in the list counts as the
median one. xdist's own reorder (by the number of tests) would put test_smollm2's 7 slow tests late.

Refresh the list after a run with `--junitxml=FILE`: `python -m tests.support.module_order FILE`.
"""

from __future__ import annotations

import statistics
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).parents[1] / "module_seconds.txt"


def recorded(path: Path) -> dict[str, float]:
    """Module path (as in a node id) -> seconds, from lines `SECONDS PATH`."""
    seconds: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            value, module = line.split()
            seconds[module] = float(value)
    return seconds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not RECORD.exists():
        return
    seconds = recorded(RECORD)
    default = statistics.median(seconds.values()) if seconds else 0.0
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], index)

    def key(item: pytest.Item) -> tuple[float, int]:
        module = item.nodeid.split("::")[0]
        return (-seconds.get(module, default), first[module])

    items.sort(key=key)  # stable: a module's tests keep their order


def from_junit(path: Path) -> dict[str, float]:
    """Each module's seconds (its tests' setup, call and teardown) from a pytest --junitxml file."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        cut = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        seconds["/".join(parts[: cut + 1]) + ".py"] += float(case.get("time", "0"))
    return seconds


if __name__ == "__main__":
    modules = from_junit(Path(sys.argv[1]))
    lines = [f"{value:.1f} {module}" for module, value in sorted(modules.items(), key=lambda kv: -kv[1])]
    header = "# Each test module's wall seconds in one run (tests/support/module_order.py), longest first.\n"
    RECORD.write_text(header + "\n".join(lines) + "\n")
