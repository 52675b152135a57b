"""The benchmarks' child processes: launcher.children.Child run from the repository root with stderr merged
into stdout, so a failure shows the child's last lines."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.children import Child, ChildFailed

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

__all__ = ["PYTHON", "REPO_ROOT", "ChildFailed", "ChildProcess"]


class ChildProcess(Child):
    def __init__(self, name: str, args: list[str], *, stdin: bool = False) -> None:
        super().__init__(name, args, cwd=REPO_ROOT, stdin=stdin, die_with_parent=True)
