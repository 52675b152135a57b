"""Issue 9, item 6: `--workers N` runs N shim processes on one port. Each worker serves on its own (the
other one stopped by SIGSTOP), /metrics answered by one worker counts the requests the other served, a
worker that dies is replaced, and SIGTERM to the parent stops every worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.prometheus import parse, total
from tests.support.processes import ServerProcess, ShimProcess, start_shim, wait_until

BODY = {"model": "mlp", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [0.5] * 512}]}
INFER = {"route": "/v1/infer", "status": "200"}


def workers_of(shim: ShimProcess) -> set[int]:
    """The worker processes: the parent's children started by multiprocessing's spawn."""
    found = set()
    for child in Path(f"/proc/{shim.pid}/task/{shim.pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(int(child))
        except FileNotFoundError:
            continue  # exited since the listing
    return found


def log_of(shim: ShimProcess) -> str:
    assert shim.stderr_path is not None
    return shim.stderr_path.read_text()


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def pause(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: state_of(pid) == "T", 10, "the worker to stop")


def infer_on_new_connection(shim: ShimProcess) -> int:
    return httpx.post(f"{shim.url}/v1/infer", json=BODY, timeout=30).status_code


def served(shim: ShimProcess) -> float:
    scraped = httpx.get(f"{shim.url}/metrics", timeout=30)
    assert scraped.status_code == 200
    return total(parse(scraped.text), "sluice_shim_requests_total", **INFER)


@pytest.fixture
def shim2(server: ServerProcess) -> Iterator[ShimProcess]:
    proc = start_shim(server.target, "--workers", "2")
    yield proc
    if proc.proc.poll() is not None:
        return
    for pid in workers_of(proc):
        os.kill(pid, signal.SIGCONT)  # a test that failed with a worker stopped
    proc.terminate()


def test_each_worker_serves_and_metrics_sum_over_workers(shim2: ShimProcess) -> None:
    first, second = sorted(workers_of(shim2))
    pause(first)
    try:
        assert [infer_on_new_connection(shim2) for _ in range(10)] == [200] * 10  # all by `second`
    finally:
        os.kill(first, signal.SIGCONT)
    pause(second)
    try:
        assert served(shim2) == 10  # answered by `first`, which served none of them
        assert infer_on_new_connection(shim2) == 200
    finally:
        os.kill(second, signal.SIGCONT)
    assert served(shim2) == 11


def test_a_dead_worker_is_replaced_and_sigterm_stops_them_all(shim2: ShimProcess) -> None:
    first, second = sorted(workers_of(shim2))
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: len(workers_of(shim2) - {first}) == 2, 60, "a replacement worker")
    assert "exited with -9; starting another" in log_of(shim2)
    wait_until(lambda: log_of(shim2).count(" serving (pid ") == 3, 60, "the replacement to serve")
    workers = workers_of(shim2)
    assert second in workers
    assert [infer_on_new_connection(shim2) for _ in range(5)] == [200] * 5
    assert shim2.terminate() == 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} outlived the shim"
