"""The real server and shim as test subprocesses on port 0, waited for by what they print (launcher.children
does the supervision; these add the tests' conventions: stderr to a file, lines seen earlier count)."""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from bench.prometheus import Samples, scrape, total
from launcher.children import Child

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


class Process(Child):
    """A child whose stderr goes to a file and whose banner waits also see lines printed earlier."""

    def wait_for_line(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        return self.wait_for(pattern, timeout, rescan=True)

    def terminate(self, timeout: float = 60.0) -> int:
        return self.stop(timeout)


P = TypeVar("P", bound=Process)


def spawn(cls: type[P], name: str, args: Sequence[str], env: dict[str, str] | None = None) -> P:
    """`python args...` from the repository root; it dies with the test run, however that ends."""
    stderr = Path(tempfile.mkstemp(prefix=f"sluice-{name}-", suffix=".log")[1])
    return cls(name, [sys.executable, *args], cwd=ROOT, env=env, stderr_path=stderr, die_with_parent=True)


class ServerProcess(Process):
    port = 0
    metrics_port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

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
    server = spawn(
        ServerProcess,
        "server",
        [*entry, "--port", "0", "--metrics-port", "0", "--log-level", "WARNING", *flags],
    )
    m = server.wait_for_line(r"listening on [^:]+:(\d+) \(metrics http://[^:]+:(\d+)/metrics\)")
    server.port, server.metrics_port = int(m.group(1)), int(m.group(2))
    if wait_ready:
        server.wait_for_line(r"sluice server ready")
    return server


class ShimProcess(Process):
    port = 0

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
