"""Issue 34, item 2: `sluice serve` and `sluice up` choose the served models by one rule, written in both
--help texts: naming --hf-models alone serves only those (no embedded models), and `--models ''` reads as
left out, so `--hf-models smol=DIR --models ''` serves smol alone under both commands, as does `up
--hf-models smol=DIR` without --models."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clients import SluiceClient
from tests.support.packages import require
from tests.support.processes import ROOT, Process, ServerProcess

require("transformers")

SLUICE = str(Path(sys.executable).parent / "sluice")
CLI = ["-c", "import sys; from launcher.cli import main; sys.exit(main())"]
RULE = (
    "left out or empty (--models ''): only the --hf-models, or the embedded models when no --hf-models is "
    "given"
)


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.hf_models import save

    return save("llama", tmp_path_factory.mktemp("hf") / "smol")


@pytest.fixture(scope="module", params=[("--models", ""), ()], ids=["empty-models", "no-models"])
def up_stack(smol: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """`sluice up --hf-models smol=DIR [--models '']` on free ports: its gRPC target and HTTP URL."""
    command = [SLUICE, "up", "--hf-models", f"smol={smol}", *request.param, "--grpc-port", "0"]
    up = Process("up", [*command, "--http-port", "0"], cwd=ROOT, die_with_parent=True)
    try:
        banner = up.wait_for_line(r"sluice up: gRPC on (\S+), HTTP on (\S+); Ctrl-C stops both")
        yield banner.group(1), banner.group(2)
        up.signal(signal.SIGTERM)
        assert up.proc.wait(90) == 0, up.diagnostics()
    finally:
        up.stop(30)


def test_serve_with_hf_models_and_an_empty_models_serves_only_those(smol: Path) -> None:
    flags = ["serve", "--hf-models", f"smol={smol}", "--models", "", "--port", "0", "--metrics-port", "0"]
    server = ServerProcess(flags, entry=CLI, cwd=ROOT)
    try:
        server.wait_listening()
        server.wait_ready()
        with SluiceClient(server.target) as client:
            assert [m.name for m in client.list_models()] == ["smol"]
    finally:
        assert server.stop(30) == 0, server.diagnostics()


def test_up_with_hf_models_serves_only_those_as_serve_does(up_stack: tuple[str, str]) -> None:
    grpc_target, http_url = up_stack
    with SluiceClient(grpc_target) as client:
        assert [m.name for m in client.list_models()] == ["smol"]
    listed = httpx.get(f"{http_url}/v1/models", timeout=30).json()["data"]
    assert [model["id"] for model in listed] == ["smol"]


@pytest.mark.parametrize("command", ["serve", "up"])
def test_both_helps_state_the_one_rule(command: str) -> None:
    done = subprocess.run(
        [SLUICE, command, "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    assert RULE in " ".join(done.stdout.split())
