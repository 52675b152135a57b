"""Child: one supervised child process, as `sluice up`, the benchmarks and the tests start the server and the
shim. Its output is read line by line on a thread (so a chatty child never blocks on a full pipe), kept in a
bounded tail and optionally relayed; waiting for a banner line is bounded in time; stop() sends SIGTERM,
then SIGKILL. Started with `die_with_parent`, it gets SIGTERM from the kernel when its parent dies, even by
SIGKILL (the kernel ties that to the thread that started the child: start such children from a thread that
outlives them, as the main thread does).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


class ChildFailed(RuntimeError):
    """The child exited, or did not print what was expected in time; carries its last lines."""


# What a child runs before it becomes its program: signal dispositions back to the defaults (a parent
# started with SIGINT ignored, as a background job is, would pass that on through exec), the death signal
# asked for, and exec. A trampoline instead of a preexec_fn: with a preexec_fn Python forks, and the
# fork handlers of a parent holding gRPC state (pytest's in-process servers) now and then crashed the
# child between fork and exec (SIGSEGV, "epoll_wait error: Bad file descriptor"); without one it uses
# vfork, which runs none. The death signal survives exec, as it did from the preexec_fn.
_TRAMPOLINE = f"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if sys.argv[2] == "1":
    import ctypes
    asked = ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM) == 0
    if not asked or os.getppid() != int(sys.argv[1]):
        os._exit(1)  # the parent died before the request took effect
os.execvp(sys.argv[3], sys.argv[3:])
"""


def _trampolined(args: Sequence[str], die_with_parent: bool) -> list[str]:
    """`args` behind the trampoline; a program that is not there fails here, in the parent, as Popen's."""
    if shutil.which(args[0]) is None:
        raise FileNotFoundError(2, "No such file or directory", args[0])
    flag = "1" if die_with_parent else "0"
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), flag, *args]


class Child:
    """`args` run with stdout piped (stderr merged, or to `stderr_path`); lines are kept, maybe relayed."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        stderr_path: Path | None = None,
        stdin: bool = False,
        relay: Callable[[str], None] | None = None,
        die_with_parent: bool = False,
        history: int = 5000,
    ) -> None:
        self.name = name
        self.stderr_path = stderr_path
        self._relay = relay
        err: IO[str] | int = subprocess.STDOUT
        if stderr_path is not None:
            err = stderr_path.open("w")
        try:
            self.proc = subprocess.Popen(
                _trampolined(args, die_with_parent),
                cwd=cwd,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        finally:
            if not isinstance(err, int):
                err.close()
        self.lines: deque[str] = deque(maxlen=history)
        self._read_count = 0  # lines read so far; self.lines holds the newest `history` of them
        self._cursor = 0  # the next line (by count) that wait_for looks at
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def tail(self) -> list[str]:
        return list(self.lines)[-40:]

    def _read(self) -> None:
        if self.proc.stdout is None:
            return
        with self.proc.stdout:  # closed at EOF: an unclosed pipe is a ResourceWarning (an error under pytest)
            for raw in self.proc.stdout:
                line = raw.rstrip("\n")
                if self._relay is not None:
                    self._relay(line)
                with self._changed:
                    self.lines.append(line)
                    self._read_count += 1
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout_s: float, *, rescan: bool = False) -> re.Match[str]:
        """The first line matching `pattern` after the last line a wait returned (from the oldest line kept
        when `rescan`); raises ChildFailed if the child exits or prints no such line in time."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            index = self._read_count - len(self.lines) if rescan else self._cursor
            while True:
                first_kept = self._read_count - len(self.lines)
                index = max(index, first_kept)
                while index < self._read_count:
                    line = self.lines[index - first_kept]
                    index += 1
                    if match := regex.search(line):
                        self._cursor = max(self._cursor, index)
                        return match
                if self._eof:
                    raise self.failure(f"exited with {self.proc.wait()} before printing /{pattern}/")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.failure(f"printed no line matching /{pattern}/ within {timeout_s:.0f} s")
                self._changed.wait(left)

    def send(self, line: str) -> None:
        if self.proc.stdin is None:
            raise ValueError(f"{self.name} was started without stdin")
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def failure(self, what: str) -> ChildFailed:
        return ChildFailed(f"{self.name} (pid {self.pid}) {what}; {self.diagnostics()}")

    def diagnostics(self) -> str:
        """The last output lines (and of the stderr file), for failure messages."""
        out = "\n".join(f"    {line}" for line in self.tail[-15:])
        err = ""
        if self.stderr_path is not None and self.stderr_path.exists():
            err = "\n    stderr: " + self.stderr_path.read_text()[-3000:]
        return f"last output:\n{out}{err}"

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, wait up to grace_s, then SIGKILL; returns the exit code; safe to call more than once."""
        self.signal(signal.SIGTERM)
        try:
            code = self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5.0)
        self._reader.join(2.0)  # EOF follows the exit
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        return code

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
