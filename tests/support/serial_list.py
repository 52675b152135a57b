"""`--serial-list=PATH`: the parallel pass writes the node ids of the tests marked `serial` there, and the
serial pass reads them (`pytest @PATH`), so it imports and collects only their modules (8 files) instead
of all ~1,450 tests a second time (~15 s of `make test`). A pytest plugin; tests/conftest.py loads it.

Written at collection, before `-m "not serial"` deselects them; under xdist every worker collects the same
tests and writes the same list, each through its own temporary file, so a reader never sees half of one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-list",
        metavar="PATH",
        default=None,
        help="write the node ids of the tests marked serial to PATH, one a line (make test's serial pass)",
    )


@pytest.hookimpl(tryfirst=True)  # before the -m deselection (pytest's mark plugin) drops them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = config.getoption("serial_list")
    if path is None:
        return
    # An empty list would make `pytest @PATH` collect the whole suite again: a line per test marked serial,
    # and the parallel pass fails loudly rather than let the serial one run nothing or everything.
    ids = [item.nodeid for item in items if item.get_closest_marker("serial") is not None]
    if not ids:
        raise pytest.UsageError(f"--serial-list {path}: no test is marked serial in this selection")
    target = Path(path)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    partial.write_text("".join(f"{node}\n" for node in ids))
    os.replace(partial, target)
