"""The README's fenced code blocks, for the tests that run its examples as written."""

from __future__ import annotations

import re

from launcher.services import repository_root


def readme_block(starting: str) -> str:
    """The fenced code block of the README whose first line starts with `starting`."""
    text = (repository_root() / "README.md").read_text()
    for block in re.findall(r"```\w*\n(.*?)```", text, flags=re.DOTALL):
        if block.startswith(starting):
            return str(block)
    raise AssertionError(f"no README code block starts with {starting!r}")
