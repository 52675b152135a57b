"""ChildProcess: a benchmark subprocess whose output is read line by line and which is always reaped.

A reader thread drains stdout (stderr merged) for the whole life of the child, so a chatty child never
blocks on a full pipe; waiting for a line is bounded in time, and stop() terminates, then kills.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


class ChildFailed(RuntimeError):
    """The child exited, or did not print what was expected in time; carries its last lines."""


class ChildProcess:
    def __init__(self, name: str, args: list[str], *, stdin: bool = False) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=40)
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        if self.proc.stdout is None:
            return
        with self.proc.stdout:  # closed at EOF: an unclosed pipe is a ResourceWarning (an error under pytest)
            for line in self.proc.stdout:
                self.tail.append(line.rstrip("\n"))
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Returns the first line matching `pattern` (earlier lines are skipped); raises ChildFailed."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise self.failure(f"exited with {self.proc.wait()} before printing /{pattern}/")
            if match := regex.search(line):
                return match
        raise self.failure(f"printed no line matching /{pattern}/ within {timeout_s:.0f} s")

    def send(self, line: str) -> None:
        if self.proc.stdin is None:
            raise ValueError(f"{self.name} was started without stdin")
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def failure(self, what: str) -> ChildFailed:
        tail = "\n".join(f"    {line}" for line in list(self.tail)[-15:])
        return ChildFailed(f"{self.name} (pid {self.pid}) {what}; last output:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, wait up to grace_s, then SIGKILL; safe to call more than once."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        self._reader.join(2.0)  # EOF follows the exit
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def __enter__(self) -> ChildProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
