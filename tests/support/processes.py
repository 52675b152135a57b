"""Starts the real server and shim as subprocesses on port 0 and waits for them by what they print."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.prometheus import Samples, scrape, total

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


@dataclass
class Process:
    """A child process whose stdout lines are collected by a reader thread."""

    proc: subprocess.Popen[str]
    name: str
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)
    stderr_path: Path | None = None

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self._queue.put(line)
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        """Blocks until a stdout line matches (lines seen earlier count too)."""
        for line in self.lines:
            if m := re.search(pattern, line):
                return m
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TimeoutError(
                    f"{self.name}: no line /{pattern}/ in {timeout}s; {self.diagnostics()}"
                ) from None
            if line is None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.wait()}) before /{pattern}/; {self.diagnostics()}"
                )
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m

    def diagnostics(self) -> str:
        err = self.stderr_path.read_text()[-3000:] if self.stderr_path and self.stderr_path.exists() else ""
        return f"stdout={''.join(self.lines)[-2000:]!r} stderr={err!r}"

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


P = TypeVar("P", bound=Process)


def spawn(cls: type[P], name: str, args: Sequence[str], env: dict[str, str] | None = None) -> P:
    stderr = Path(tempfile.mkstemp(prefix=f"sluice-{name}-", suffix=".log")[1])
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    return cls(proc, name, stderr_path=stderr)


@dataclass
class ServerProcess(Process):
    port: int = 0
    metrics_port: int = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> Samples:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return total(self.metrics(), name, **labels)


def start_server(*flags: str, wait_ready: bool = True) -> ServerProcess:
    server = spawn(
        ServerProcess,
        "server",
        ["-m", "server", "--port", "0", "--metrics-port", "0", "--log-level", "WARNING", *flags],
    )
    m = server.wait_for_line(r"listening on [^:]+:(\d+) \(metrics http://[^:]+:(\d+)/metrics\)")
    server.port, server.metrics_port = int(m.group(1)), int(m.group(2))
    if wait_ready:
        server.wait_for_line(r"sluice server ready")
    return server


@dataclass
class ShimProcess(Process):
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_shim(upstream: str, *flags: str) -> ShimProcess:
    shim = spawn(
        ShimProcess,
        "shim",
        ["-m", "shim", "--upstream", upstream, "--host", "127.0.0.1", "--port", "0", *flags],
    )
    shim.port = int(shim.wait_for_line(r"listening on http://[^:]+:(\d+)").group(1))
    return shim


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Polls a condition (never a fixed sleep) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
