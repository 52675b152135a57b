"""Acceptance 6 (run command): `sluice up` starts server and shim, one completion streams over SSE through
it, and Ctrl-C stops both cleanly. `make up` runs exactly this command after setting up."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.processes import Process, spawn


def test_sluice_up_serves_a_streamed_completion_and_stops_on_ctrl_c() -> None:
    sluice = str(Path(sys.executable).parent / "sluice")
    up = spawn(
        Process,
        "up",
        [
            "-c",
            "import sys; from server.cli import main; sys.exit(main())",
            "up",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
        ],
    )
    assert Path(sluice).exists()  # the console script the README's command runs
    try:
        grpc_port = int(up.wait_for_line(r"sluice server listening on [^:]+:(\d+)").group(1))
        http_port = int(up.wait_for_line(r"sluice shim listening on http://[^:]+:(\d+)").group(1))
        up.wait_for_line(r"Ctrl-C stops both")
        assert grpc_port and http_port
        body = {"model": "byte-lm", "prompt": "Once upon a time", "max_tokens": 16, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", f"http://127.0.0.1:{http_port}/v1/generate", json=body, timeout=30) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("event:"):
                    events.append(line.split(":", 1)[1].strip())
                if line.startswith("data:") and events[-1] == "done":
                    assert json.loads(line[5:])["usage"]["completion_tokens"] == 16
        assert events[0] == "token" and events[-1] == "done"
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0, up.diagnostics()
        up.wait_for_line(r"sluice server stopped")
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
            up.proc.wait()
    leftovers = subprocess.run(
        ["pgrep", "-f", f"--upstream 127.0.0.1:{grpc_port}"], capture_output=True, check=False
    )
    assert leftovers.stdout == b"", "the shim outlived sluice up"
