"""`python -m shim`: the listening line with the real port for --port 0, and flag errors."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
LISTENING = re.compile(r"^sluice shim listening on http://127\.0\.0\.1:(\d+) \(upstream 127\.0\.0\.1:1\)$")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "protos"), env.get("PYTHONPATH", "")])
    return env


def _read_line(process: subprocess.Popen[str], *, within_s: float) -> str:
    """One stdout line, waiting on the pipe's readiness rather than sleeping."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + within_s
        while (remaining := deadline - time.monotonic()) > 0:
            if selector.select(remaining):
                return process.stdout.readline().rstrip("\n")
    raise TimeoutError("the shim did not print its listening line")


@pytest.fixture
def shim_process() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "shim", "--upstream", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=_env(),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def test_port_zero_prints_the_bound_port_and_serves(shim_process: subprocess.Popen[str]) -> None:
    line = _read_line(shim_process, within_s=30)
    match = LISTENING.match(line)
    assert match is not None, line
    port = int(match.group(1))
    assert port != 0
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").status_code == 503
    shim_process.send_signal(signal.SIGTERM)
    # uvicorn re-raises the captured signal after a graceful shutdown, so the process dies by it.
    assert shim_process.wait(timeout=15) in (0, -signal.SIGTERM)
    assert shim_process.stderr is not None
    assert "Traceback" not in shim_process.stderr.read()


def test_invalid_flag_value_exits_with_the_setting_named() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shim", "--max-inflight", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "max_inflight must be at least 1" in result.stderr
