"""Issue 7, item 4, from outside: a shim whose descriptor limit is 1,024 (hard, so raising it cannot help)
is flooded with more idle connections than it may hold. While the flood goes on a bystander is served
within its normal latency; the shim never runs out of descriptors, stays quiet in its log and idle on
the CPU afterwards."""

from __future__ import annotations

import re
import resource
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.support.processes import ServerProcess, ShimProcess, start_shim, wait_until
from tests.support.skips import skip_for_hardware

FD_LIMIT = 1024
# The flood holds more connections than the shim's whole descriptor limit, and keeps opening new ones.
FLOOD_HELD = FD_LIMIT + 300
# Bounds of the attack loop; the test stops it sooner, once the bystander has been served.
FLOOD_ATTEMPTS = 50_000
FLOOD_FOR_S = 30.0
BYSTANDER = {
    "model": "mlp",
    "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
}


@pytest.fixture
def limited_shim(server: ServerProcess) -> Iterator[ShimProcess]:
    # Idle connections stay until the cap makes room, so the flood meets the cap, not the idle timer.
    shim = start_shim(server.target, "--idle-timeout-s", "60", fd_limit=FD_LIMIT)
    try:
        yield shim
    finally:
        shim.terminate()


@pytest.fixture
def own_descriptors() -> Iterator[None]:
    """This test process holds the flood's sockets: its soft limit goes up to its hard one meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FLOOD_HELD + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        skip_for_hardware(f"the flood needs {wanted} descriptors in the test process; the hard limit: {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Flood:
    """Opens idle connections as fast as it can until stopped, holding the newest FLOOD_HELD; bounded in
    count and time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.held: deque[socket.socket] = deque()
        self.opened = 0
        self.attempts = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ends = time.monotonic() + FLOOD_FOR_S
        while not self.stop.is_set() and self.attempts < FLOOD_ATTEMPTS and time.monotonic() < ends:
            self.attempts += 1
            try:
                self.held.append(socket.create_connection(("127.0.0.1", self.port), timeout=2))
            except OSError:
                continue  # out of ports or a full queue: the next attempt is the flood going on
            self.opened += 1
            if len(self.held) > FLOOD_HELD:
                self.held.popleft().close()

    def __enter__(self) -> Flood:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        while self.held:
            self.held.popleft().close()


def bystander(shim: ShimProcess) -> float:
    started = time.monotonic()
    response = httpx.post(f"{shim.url}/v1/infer", json=BYSTANDER, timeout=30)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


@pytest.mark.serial  # compares bystanders' latency against unloaded ones: run alone
def test_a_flood_of_idle_connections_cannot_exhaust_the_descriptors(
    limited_shim: ShimProcess, own_descriptors: None
) -> None:
    assert limited_shim.stderr_path is not None
    # Logged at start-up, before the listening line.
    budget = re.search(
        r"soft limit (\d+), hard limit (\d+); holding at most (\d+) HTTP",
        limited_shim.stderr_path.read_text(),
    )
    assert budget is not None, limited_shim.diagnostics()
    assert (int(budget.group(1)), int(budget.group(2))) == (FD_LIMIT, FD_LIMIT)
    assert int(budget.group(3)) < FD_LIMIT
    limit = max(1.0, 5 * max(bystander(limited_shim) for _ in range(5)))
    shim_process = psutil.Process(limited_shim.proc.pid)
    with Flood(limited_shim.port) as flood:
        wait_until(lambda: flood.opened > FLOOD_HELD, what="the flood to outnumber the descriptor limit")
        opened_before = flood.opened
        latencies = [bystander(limited_shim) for _ in range(10)]
        assert flood.thread.is_alive() and flood.opened > opened_before, "the flood must still be going on"
        assert shim_process.num_fds() < FD_LIMIT
    assert max(latencies) < limit, (latencies, limit)
    assert flood.opened > FLOOD_HELD
    # Afterwards: the shim serves, spins no CPU on dead sockets, and its log stayed small.
    assert bystander(limited_shim) < limit
    cpu_before = sum(shim_process.cpu_times()[:2])
    time.sleep(1.0)  # a measurement window, not a wait for a condition
    assert sum(shim_process.cpu_times()[:2]) - cpu_before < 0.3
    log = limited_shim.stderr_path.read_text()
    assert len(log) < 16 * 1024, log[-2000:]
    assert "out of system resource" not in log
    assert "Too many open files" not in log
