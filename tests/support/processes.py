"""The real server and shim as test subprocesses on port 0 (launcher.services), with the tests'
conventions: stderr to a file, lines printed earlier count for a wait, metrics scraped on demand, and every
child dies with the test run however that ends."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.prometheus import Samples, scrape, total
from launcher.children import Child
from launcher.services import START_TIMEOUT_S, ServerChild, ShimChild, repository_root, wait_until

ROOT = repository_root()

__all__ = [
    "ROOT",
    "Process",
    "ServerProcess",
    "ShimProcess",
    "spawn",
    "start_server",
    "start_shim",
    "wait_until",
]


def _options(name: str) -> dict[str, Any]:
    stderr = Path(tempfile.mkstemp(prefix=f"sluice-{name}-", suffix=".log")[1])
    return {"cwd": ROOT, "stderr_path": stderr, "die_with_parent": True}


class Process(Child):
    """A child a test started; waits see the lines printed before them too."""

    def wait_for_line(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        return self.wait_for(pattern, timeout, rescan=True)

    def terminate(self, timeout: float = 60.0) -> int:
        return self.stop(timeout)


def spawn(name: str, args: list[str]) -> Process:
    """`python ARGS` from the repository root."""
    return Process(name, [sys.executable, *args], **_options(name))


class ServerProcess(ServerChild, Process):
    def metrics(self) -> Samples:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return total(self.metrics(), name, **labels)


def start_server(*flags: str, wait_ready: bool = True, fd_limit: int | None = None) -> ServerProcess:
    """`python -m server` on port 0; `fd_limit` starts it with that soft and hard RLIMIT_NOFILE."""
    entry = ["-m", "server"]
    if fd_limit is not None:
        entry = [
            "-c",
            f"import resource, runpy; resource.setrlimit(resource.RLIMIT_NOFILE, ({fd_limit}, {fd_limit})); "
            "runpy.run_module('server', run_name='__main__', alter_sys=True)",
        ]
    base = ["--port", "0", "--metrics-port", "0", "--log-level", "WARNING"]
    server = ServerProcess([*base, *flags], entry=entry, **_options("server"))
    server.wait_listening(START_TIMEOUT_S, rescan=True)
    if wait_ready:
        server.wait_ready(START_TIMEOUT_S, rescan=True)
    return server


class ShimProcess(ShimChild, Process):
    pass


def start_shim(upstream: str, *flags: str) -> ShimProcess:
    shim = ShimProcess(
        ["--upstream", upstream, "--host", "127.0.0.1", "--port", "0", *flags], **_options("shim")
    )
    shim.wait_listening(START_TIMEOUT_S, rescan=True)
    return shim
