"""Issue 7, item 14, from outside: while the server is down the shim answers 503 UPSTREAM_UNAVAILABLE
with gRPC's reason and a Retry-After, and once a server is ready again on the same port the shim serves
within a couple of seconds (gRPC's own reconnect back-off, grown over an outage, waits up to 120 s)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

OUTAGE_S = 10.0
BYSTANDER = {
    "model": "mlp",
    "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}],
}


def infer(shim: ShimProcess) -> httpx.Response:
    return httpx.post(f"{shim.url}/v1/infer", json=BYSTANDER, timeout=30)


@pytest.mark.serial  # compares the reconnect's wall time: run alone
def test_the_shim_explains_an_outage_and_serves_soon_after_the_server_is_back() -> None:
    processes: list[ServerProcess | ShimProcess] = []
    try:
        server = start_server()
        processes.append(server)
        shim = start_shim(server.target)
        processes.append(shim)
        assert infer(shim).status_code == 200
        server.proc.kill()  # SIGKILL: no drain, no goodbye to the shim's channel
        server.proc.wait()
        # Long enough that gRPC's default back-off (1 s growing by 1.6x) would wait several seconds.
        answers = 0
        outage_ends = time.monotonic() + OUTAGE_S
        while time.monotonic() < outage_ends:
            down = infer(shim)  # each call fails fast, after the channel's own retries
            answers += 1
            assert down.status_code == 503, down.text
            assert down.headers["retry-after"] == "1"
            error = down.json()["error"]
            assert (error["code"], error["reason"], error["domain"]) == (
                "UNAVAILABLE",
                "UPSTREAM_UNAVAILABLE",
                "shim.sluice",
            )
            assert error["message"].startswith("the upstream server is unavailable: ")
            assert error["retry_after_s"] == 1.0
        assert answers >= 3
        ready = httpx.get(f"{shim.url}/readyz", timeout=30)
        assert (ready.status_code, ready.json()["reason"]) == (503, "UPSTREAM_UNAVAILABLE")
        restarted = start_server("--port", str(server.port))  # returns once it prints "ready"
        processes.append(restarted)
        ready_at = time.monotonic()
        while (back := infer(shim)).status_code != 200:
            assert back.status_code == 503, back.text
            assert time.monotonic() - ready_at < 10, "the shim did not reconnect"
        assert time.monotonic() - ready_at < 2.5
    finally:
        for process in reversed(processes):
            process.terminate()
