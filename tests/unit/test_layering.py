"""The layout is the architecture: nothing imports upward (the server never imports the shim, the clients or
the launcher), runtimes never see the wire, and the shared base packages depend on none of the services.
Inside the shim, what every API family shares knows no family and no API path, and families are peers that
never import each other: a new family is a folder and one entry in shim/app.py."""

from __future__ import annotations

import ast
import re
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
    "wire": {"server", "shim", "clients", "process", "auth", "launcher", "bench", "tests"},
}

# Inside the server: server.X -> the server packages it must never import. The request path runs
# admission -> servicer -> batching -> runtimes; memory and codec sit beside it and look at neither end.
SERVER_FORBIDDEN = {
    "batching": {"admission", "servicer", "app", "placement", "frontends"},
    "runtimes": {"admission", "batching", "servicer", "codec", "app", "placement", "frontends"},
    "codec": {"admission", "batching", "runtimes", "servicer", "app", "placement", "frontends"},
    "memory": {"admission", "batching", "servicer", "codec", "app", "placement", "frontends"},
    "admission": {"batching", "runtimes", "servicer", "app", "placement"},
    # Logits processing and tool calls serve the scheduler and the runtimes' chat templates: below both.
    "logits": {"admission", "batching", "servicer", "codec", "app", "placement", "frontends"},
    "tools": {"admission", "batching", "runtimes", "servicer", "codec", "app", "placement", "logits"},
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from shim import native`
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_nothing_imports_upward(package: str) -> None:
    offences = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in imports(path):
            if module.split(".")[0] in FORBIDDEN[package]:
                offences.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offences, offences


@pytest.mark.parametrize("package", sorted(SERVER_FORBIDDEN))
def test_server_packages_import_only_down_the_request_path(package: str) -> None:
    offences = []
    for path in sorted((ROOT / "server" / package).rglob("*.py")):
        for module in imports(path):
            parts = module.split(".")
            if parts[0] == "server" and len(parts) > 1 and parts[1] in SERVER_FORBIDDEN[package]:
                offences.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offences, offences


def test_runtimes_never_see_the_wire() -> None:
    offences = []
    for path in sorted((ROOT / "server" / "runtimes").rglob("*.py")):
        for module in imports(path):
            if module.split(".")[0] in {"grpc", "grpc_status", "sluice", "google"}:
                offences.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offences, offences


SHIM = ROOT / "shim"
SHIM_COMPOSITION = {Path("app.py")}  # the one module that knows the families, to attach them
API_PATH = re.compile(r"^/v\d+(/|$)")


def shim_families() -> set[str]:
    """The shim's API families: its folders whose __init__ defines `attach(app)`."""
    families = set()
    for init in sorted(SHIM.glob("*/__init__.py")):
        body = ast.parse(init.read_text()).body
        if any(isinstance(node, ast.FunctionDef) and node.name == "attach" for node in body):
            families.add(init.parent.name)
    return families


def family_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "shim" and parts[1] in shim_families() else None


def shared_shim_modules() -> list[Path]:
    families = shim_families()
    return [
        path
        for path in sorted(SHIM.rglob("*.py"))
        if path.relative_to(SHIM).parts[0] not in families and path.relative_to(SHIM) not in SHIM_COMPOSITION
    ]


def test_the_shim_has_its_families() -> None:
    assert {"health", "native", "openai"} <= shim_families()


def test_the_shims_shared_modules_import_no_family() -> None:
    offences = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in shared_shim_modules()
        for module in sorted(imports(path))
        if family_of(module) is not None
    ]
    assert not offences, offences


@pytest.mark.parametrize("family", sorted(shim_families()))
def test_shim_families_never_import_each_other(family: str) -> None:
    offences = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((SHIM / family).rglob("*.py"))
        for module in sorted(imports(path))
        if family_of(module) not in (None, family)
    ]
    assert not offences, offences


def test_the_shims_shared_modules_name_no_api_path() -> None:
    """Whose a request is (its error shape, whether it is the API) is asked of shim.families, not read from
    a path: a path in shared code is a family's knowledge in the wrong place."""
    offences = [
        f"{path.relative_to(ROOT)}:{node.lineno} names {node.value!r}"
        for path in shared_shim_modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and API_PATH.match(node.value)
    ]
    assert not offences, offences


PACKAGES = ("server", "shim", "clients", "process", "auth", "launcher", "wire")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each first-party module -> the first-party modules it imports, wherever the import stands (a function's
    deferred import is still an arrow: it only moves the cycle to run time). `from a import b` is an arrow
    to a.b where that is a module, else to a."""
    paths = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}

    def known(module: str) -> str:
        while module and module not in paths:
            module = module.rpartition(".")[0]
        return module

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {known(f"{node.module}.{alias.name}") for alias in node.names}
        graph[name] = found - {"", name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    """server/config.py once imported the model registry (for --help), which imported config: a module that
    needs another's names is below it, and nothing it reaches may need it back."""
    assert cycles(import_graph()) == []
