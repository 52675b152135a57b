"""Issue 36, item 7: scripts/setup_test_tools.sh installs what the suites drive (h2load, Chromium, promtool,
Node, npm) and, when it cannot, exits non-zero naming each Debian package, instead of going on quietly.
Run against a PATH holding only fakes (apt-get, id, npm) so nothing is installed here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import ROOT

SCRIPT = ROOT / "scripts" / "setup_test_tools.sh"
PACKAGES = ("nghttp2-client", "chromium", "prometheus", "nodejs", "npm", "redis-server")
TOOLS = ("h2load", "chromium", "promtool", "node", "npm", "redis-server")
BASH = shutil.which("bash") or "/bin/bash"


def fake(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    """A bin folder that holds none of the tools: only dirname, a root `id` and an apt-get that logs."""
    folder = tmp_path / "bin"
    folder.mkdir()
    dirname = shutil.which("dirname")
    assert dirname is not None
    (folder / "dirname").symlink_to(dirname)
    fake(folder, "id", "echo 0")
    fake(folder, "apt-get", f'echo "$*" >> {tmp_path}/apt.log')
    return folder


def run(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SCRIPT)], env={"PATH": str(folder)}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_a_failed_apt_get_update_fails_naming_every_package(machine: Path) -> None:
    fake(machine, "apt-get", '[ "$1" = update ] && exit 100; exit 0')
    done = run(machine)
    assert done.returncode != 0
    assert "apt-get update failed" in done.stderr
    for package in PACKAGES:
        assert package in done.stderr


def test_an_install_that_brings_nothing_fails_naming_each_tool(machine: Path, tmp_path: Path) -> None:
    done = run(machine)
    assert done.returncode != 0
    for tool, package in zip(TOOLS, PACKAGES, strict=True):
        assert f"{tool} (Debian: {package})" in done.stderr
    assert "install -y" in (tmp_path / "apt.log").read_text()


def test_without_root_it_fails_naming_what_to_install(machine: Path, tmp_path: Path) -> None:
    fake(machine, "id", "echo 1000")
    done = run(machine)
    assert done.returncode != 0
    assert "missing: h2load (Debian: nghttp2-client)" in done.stderr
    assert not (tmp_path / "apt.log").exists()


def test_what_apt_get_installs_is_found_and_npm_ci_runs(machine: Path, tmp_path: Path) -> None:
    made = " ".join(f"{machine}/{tool}" for tool in TOOLS)
    write = f'printf "#!{BASH}\\n" > $t; /bin/chmod +x $t'
    install = f'if [ "$1" = install ]; then for t in {made}; do {write}; done; fi'
    fake(machine, "apt-get", f'echo "$*" >> {tmp_path}/apt.log\n{install}')
    done = run(machine)
    assert done.returncode == 0, done.stderr
    asked = (tmp_path / "apt.log").read_text()
    assert all(package in asked for package in PACKAGES), asked
    # The fake npm apt-get wrote does nothing: a later run with every tool present calls it for `npm ci`.
    fake(machine, "npm", f'echo "$PWD $*" >> {tmp_path}/npm.log')
    (tmp_path / "apt.log").unlink()
    assert run(machine).returncode == 0
    assert not (tmp_path / "apt.log").exists()
    assert (tmp_path / "npm.log").read_text().startswith(f"{ROOT / 'clients' / 'node'} ci ")
