"""`require(...)`: skip a test module whole when a package it drives is not installed, as
`pytest.importorskip` does, without importing it at collection.

Why: every xdist worker collects every module, so a module-level importorskip runs the import in each
worker, though only one runs the module's tests: `anthropic` 3.4 CPU-s, `peft` (and the transformers
modules it loads) ~3, `agents` 2.1 (loaded, 2-core EPYC). find_spec locates a package without running it;
the tests import it where they use it. The skip is a collection skip like importorskip's, which a strict run
(tests/support/skips.py) turns into a failure naming the package.
"""

from __future__ import annotations

import importlib.util

import pytest


def require(*packages: str) -> None:
    """Skips the calling module (at its top level) unless every package in `packages` is installed."""
    for package in packages:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"could not import {package!r}: not installed", allow_module_level=True)
