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


ROUNDS = 3


def one_round() -> tuple[Counter[str], float, float]:
    """96 concurrent 4 MiB calls against a fresh server: (outcomes, peak RSS growth in MB, refusals)."""
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
    return outcomes, growth_mb, refused


def test_96_callers_of_4_mib_stay_within_the_request_bytes_budget() -> None:
    growths = []
    for _ in range(ROUNDS):
        outcomes, growth_mb, refused = one_round()
        print(f"\n96 x 4 MiB, budget 8 MiB: {dict(outcomes)}; server peak RSS growth {growth_mb:.0f} MB")
        assert sum(outcomes.values()) == CALLERS  # none lost
        assert set(outcomes) <= {"OK", "REQUEST_BYTES"} and outcomes["OK"] >= 2
        assert outcomes["REQUEST_BYTES"] >= 1
        assert refused == outcomes["REQUEST_BYTES"]
        growths.append(growth_mb)
    # gRPC's own receive buffers come on top of the budget, and how many 4 MiB messages it holds at once
    # depends on timing: 79-213 MB in most runs on these 2-core machines, but 269 and 489 MB in single
    # runs (at 46ac099 too). With most calls parsed (a 64 MiB budget) every run grew 304-374 MB. So the
    # bound is on the least of three rounds, each against a fresh server.
    assert min(growths) < 260, growths
