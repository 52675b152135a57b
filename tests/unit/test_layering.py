"""The layout is the architecture: nothing imports upward (the server never imports the shim, the clients or
the launcher), runtimes never see the wire, and the shared base packages depend on none of the services."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level packages it must never import
FORBIDDEN = {
    "server": {"shim", "clients", "launcher", "bench", "tests"},
    "shim": {"server", "launcher", "bench", "tests"},
    "clients": {"server", "shim", "launcher", "bench", "tests"},
    "process": {"server", "shim", "clients", "launcher", "bench", "tests"},
    "auth": {"server", "shim", "clients", "launcher", "bench", "tests"},
    "launcher": {"bench", "tests"},
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_nothing_imports_upward(package: str) -> None:
    offences = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in imports(path):
            if module.split(".")[0] in FORBIDDEN[package]:
                offences.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offences, offences


def test_runtimes_never_see_the_wire() -> None:
    offences = []
    for path in sorted((ROOT / "server" / "runtimes").rglob("*.py")):
        for module in imports(path):
            if module.split(".")[0] in {"grpc", "grpc_status", "sluice", "google"}:
                offences.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offences, offences
