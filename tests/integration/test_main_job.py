"""`sluice up` (what `make up` runs): server and shim start, one completion streams over SSE through them,
Ctrl-C stops both cleanly, also when started with SIGINT ignored (a background job of a script), and when
`sluice up` itself is killed its children die with it (issue 7, item 16)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import byte_lm_reference
from tests.support.processes import FAST_MODELS, Process, spawn, wait_until

SLUICE_UP = ["-c", "import sys; from launcher.cli import main; sys.exit(main())", "up"]


def start_up(*flags: str, ignore_sigint: bool = False) -> Process:
    flags = ("--models", ",".join(FAST_MODELS), *flags)  # these tests stop up, not ask smollm2
    if ignore_sigint:
        # As a shell does for `cmd &` in a script: the job starts with SIGINT ignored (inherited over exec).
        ignore = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        args = ["-c", ignore + SLUICE_UP[1], "up"]
        return spawn("up", [*args, *flags])
    return spawn("up", [*SLUICE_UP, *flags])


def child_pids(parent: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(parent):
            found.append(int(status.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing.
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return state != "Z"


@pytest.fixture
def up() -> Iterator[Process]:
    proc = start_up("--grpc-port", "0", "--http-port", "0")
    yield proc
    if proc.proc.poll() is None:
        proc.proc.kill()
        proc.proc.wait()


def ports_of(up: Process) -> tuple[int, int]:
    grpc_port = int(up.wait_for_line(r"sluice server listening on [^:]+:(\d+)").group(1))
    http_port = int(up.wait_for_line(r"sluice shim listening on http://[^:]+:(\d+)").group(1))
    up.wait_for_line(r"Ctrl-C stops both")
    return grpc_port, http_port


def test_sluice_up_serves_a_streamed_completion_and_stops_on_ctrl_c(up: Process) -> None:
    sluice = str(Path(sys.executable).parent / "sluice")
    assert Path(sluice).exists()  # the console script the README's command runs
    _, http_port = ports_of(up)
    body = {"model": "byte-lm", "prompt": "Once upon a time", "max_tokens": 16, "seed": 7, "stream": True}
    events: list[str] = []
    streamed: list[int] = []
    with httpx.stream("POST", f"http://127.0.0.1:{http_port}/v1/generate", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
            if line.startswith("data:") and events[-1] == "token":
                streamed += json.loads(line[5:])["token_ids"]
            if line.startswith("data:") and events[-1] == "done":
                assert json.loads(line[5:])["usage"]["completion_tokens"] == 16
    assert events[0] == "token" and events[-1] == "done"
    assert streamed == byte_lm_reference.generate("Once upon a time", 16, seed=7)  # the seeded model's own
    children = child_pids(up.pid)
    assert len(children) == 2
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(timeout=60) == 0, up.diagnostics()
    up.wait_for_line(r"sluice server stopped")
    assert not any(alive(pid) for pid in children), "a child outlived sluice up"


def test_ctrl_c_stops_sluice_up_started_with_sigint_ignored() -> None:
    up = start_up("--grpc-port", "0", "--http-port", "0", ignore_sigint=True)
    try:
        ports_of(up)
        children = child_pids(up.pid)
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0, up.diagnostics()
        assert not any(alive(pid) for pid in children)
    finally:
        up.stop(5)


def test_children_die_with_a_killed_sluice_up(up: Process) -> None:
    ports_of(up)
    children = child_pids(up.pid)
    assert len(children) == 2
    up.proc.kill()
    up.proc.wait()
    # The kernel sends each child SIGTERM as its parent dies: they drain and exit (reaped by init).
    wait_until(lambda: not any(alive(pid) for pid in children), timeout=60, what="the orphaned children gone")
