"""The real Sluice server and shim as benchmark children on port 0: started by what they print, scraped
for Prometheus metrics, and always reaped (SIGTERM, then SIGKILL) however the block that uses them ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bench.processes import PYTHON, ChildProcess
from bench.prometheus import Samples, scrape, total

START_TIMEOUT_S = 120.0
# The server drains its open streams on SIGTERM; give it that long before the kill.
STOP_GRACE_S = 60.0


class SluiceServer(ChildProcess):
    """`python -m server` on an ephemeral gRPC port and an ephemeral metrics port."""

    def __init__(self, *flags: str) -> None:
        args = [PYTHON, "-m", "server", "--port", "0", "--metrics-port", "0", "--log-level", "WARNING"]
        super().__init__("server", [*args, *flags])
        try:
            m = self.wait_for(
                r"listening on [^:]+:(\d+) \(metrics http://[^:]+:(\d+)/metrics\)", START_TIMEOUT_S
            )
            self.port, self.metrics_port = int(m.group(1)), int(m.group(2))
            self.wait_for(r"sluice server ready", START_TIMEOUT_S)
        except BaseException:
            self.stop()  # a child that never came up is reaped here: no caller holds it yet
            raise

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> Samples:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return total(self.metrics(), name, **labels)


class SluiceShim(ChildProcess):
    """`python -m shim` in front of one server, on an ephemeral loopback port."""

    def __init__(self, upstream: str, *flags: str) -> None:
        args = [PYTHON, "-m", "shim", "--upstream", upstream, "--host", "127.0.0.1", "--port", "0"]
        super().__init__("shim", [*args, *flags])
        try:
            self.port = int(self.wait_for(r"listening on http://[^:]+:(\d+)", START_TIMEOUT_S).group(1))
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def running(*flags: str) -> Iterator[tuple[SluiceServer, SluiceShim]]:
    """The real server (with `flags`) and a shim in front of it, both reaped however the block ends."""
    server = SluiceServer(*flags)
    try:
        shim = SluiceShim(server.target)
        try:
            yield server, shim
        finally:
            shim.stop(STOP_GRACE_S)
    finally:
        server.stop(STOP_GRACE_S)
