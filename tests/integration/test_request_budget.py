"""Issue 11, point 5: the request bytes a server parses and holds are bounded. 96 concurrent requests of
4 MiB against an 8 MiB budget: every call is answered OK or RESOURCE_EXHAUSTED (REQUEST_BYTES, refused
before it is parsed), none is lost. The server's peak RSS growth is printed: gRPC has received every
message before the deserializer sees it, so its own buffers are not bounded by this budget (the note of
issue 11 has the figure)."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from clients import ResourceExhaustedError, SluiceClient
from tests.support.processes import start_server

BUDGET = 8 * 2**20  # two requests
CALLERS = 96
VALUES = (4 * 2**20 - 4096) // 4  # just under the 4 MiB message limit


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def test_96_callers_of_4_mib_stay_within_the_request_bytes_budget() -> None:
    server = start_server(
        "--plugins", "tests.support.faulty_models", "--models", "bulky", "--max-concurrency", "96",
        "--max-queue", "96", "--max-request-bytes-in-flight", str(BUDGET),
    )  # fmt: skip
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    x = np.ones(VALUES, np.float32)
    start = threading.Barrier(CALLERS)

    def call() -> None:
        with SluiceClient(server.target, timeout=60) as client:
            start.wait()
            try:
                y = client.infer("bulky", {"x": x}).outputs["y"]
                outcome = "OK" if float(y[0]) == VALUES else "WRONG"
            except ResourceExhaustedError as exc:
                outcome = str(exc.reason)
        with lock:
            outcomes[outcome] += 1

    try:
        hwm_before = status_kb(server.pid, "VmHWM")
        threads = [threading.Thread(target=call) for _ in range(CALLERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        growth_mb = (status_kb(server.pid, "VmHWM") - hwm_before) / 1024
        refused = server.metric("sluice_requests_refused_total", model="bulky", reason="REQUEST_BYTES")
    finally:
        assert server.terminate() == 0
    print(f"\n96 x 4 MiB, budget 8 MiB: {dict(outcomes)}; server peak RSS growth {growth_mb:.0f} MB")
    assert sum(outcomes.values()) == CALLERS  # none lost
    assert set(outcomes) <= {"OK", "REQUEST_BYTES"} and outcomes["OK"] >= 2 and outcomes["REQUEST_BYTES"] >= 1
    assert refused == outcomes["REQUEST_BYTES"]
    # gRPC's own receive buffers come on top of the budget: how many 4 MiB messages it holds at once
    # depends on timing (83-120 MB measured alone, 204 MB once in a loaded CI run); with most calls parsed
    # (a 64 MiB budget) the growth was 304-374 MB.
    assert growth_mb < 260, growth_mb
