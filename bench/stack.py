"""The real Sluice server and shim as benchmark children on port 0 (launcher.services), scraped for
Prometheus metrics, and always reaped (SIGTERM, then SIGKILL) however the block that uses them ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bench.processes import REPO_ROOT
from bench.prometheus import Samples, scrape, total
from launcher.services import START_TIMEOUT_S, ServerChild, ShimChild

# The server drains its open streams on SIGTERM; give it that long before the kill.
STOP_GRACE_S = 60.0


class SluiceServer(ServerChild):
    """`python -m server` on an ephemeral gRPC port and an ephemeral metrics port."""

    def __init__(self, *flags: str) -> None:
        base = ["--port", "0", "--metrics-port", "0", "--log-level", "WARNING"]
        super().__init__([*base, *flags], cwd=REPO_ROOT, die_with_parent=True)
        try:
            self.wait_listening()
            self.wait_ready(START_TIMEOUT_S)
        except BaseException:
            self.stop()  # a child that never came up is reaped here: no caller holds it yet
            raise

    def metrics(self) -> Samples:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return total(self.metrics(), name, **labels)


class SluiceShim(ShimChild):
    """`python -m shim` in front of one server, on an ephemeral loopback port."""

    def __init__(self, upstream: str, *flags: str) -> None:
        base = ["--upstream", upstream, "--host", "127.0.0.1", "--port", "0"]
        super().__init__([*base, *flags], cwd=REPO_ROOT, die_with_parent=True)
        try:
            self.wait_listening()
        except BaseException:
            self.stop()
            raise


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
