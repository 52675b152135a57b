"""The server and the shim as supervised children: how each is started on a port (0: the kernel picks), and
the one place that reads their start-up lines for the ports they bound and for readiness."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from launcher.children import Child

START_TIMEOUT_S = 120.0
LOAD_TIMEOUT_S = 900.0  # loading and warming large models can take minutes

_SERVER_LISTENING = r"sluice server listening on \S+:(\d+) \(metrics http://\S+:(-?\d+)/metrics\)"
_SERVER_READY = r"sluice server ready"
_SHIM_LISTENING = r"sluice shim listening on (https?://\S+:(\d+))"


class ServerChild(Child):
    """`python -m server FLAGS` (or `python ENTRY FLAGS`); `port` and `metrics_port` are known once it
    listens."""

    port = 0
    metrics_port = 0

    def __init__(
        self, flags: Sequence[str], *, entry: Sequence[str] = ("-m", "server"), **options: Any
    ) -> None:
        super().__init__("server", [sys.executable, *entry, *flags], **options)

    def wait_listening(self, timeout_s: float = START_TIMEOUT_S, *, rescan: bool = False) -> None:
        match = self.wait_for(_SERVER_LISTENING, timeout_s, rescan=rescan)
        self.port, self.metrics_port = int(match.group(1)), int(match.group(2))

    def wait_ready(self, timeout_s: float = LOAD_TIMEOUT_S, *, rescan: bool = False) -> None:
        self.wait_for(_SERVER_READY, timeout_s, rescan=rescan)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


class ShimChild(Child):
    """`python -m shim FLAGS`; `port` and `url` are known once it listens."""

    port = 0
    url = ""

    def __init__(
        self, flags: Sequence[str], *, entry: Sequence[str] = ("-m", "shim"), **options: Any
    ) -> None:
        super().__init__("shim", [sys.executable, *entry, *flags], **options)

    def wait_listening(self, timeout_s: float = START_TIMEOUT_S, *, rescan: bool = False) -> None:
        match = self.wait_for(_SHIM_LISTENING, timeout_s, rescan=rescan)
        self.url, self.port = match.group(1), int(match.group(2))


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Polls a condition on running services (never a fixed sleep) until it holds; raises TimeoutError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def repository_root() -> Path:
    return Path(__file__).resolve().parent.parent
