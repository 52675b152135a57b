"""How fast a full server says no: one probe caller beside a load that keeps every slot and queue place held.

In a retry storm (hundreds of callers re-sending each refusal at once) every call, refused or not, waits its
turn in the event loop, and its latency is the callers over the loop's rate (Little's law). This probe
measures the refusal itself: the load holds all N slots and all Q queue places with exactly N + Q closed-loop
callers, and one more caller, in its own process, times the answers it gets (mostly QUEUE_FULL).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import dataclass

from bench.points import Window
from bench.processes import PYTHON, ChildProcess
from bench.stats import percentile


@dataclass(frozen=True, slots=True)
class ProbeResult:
    load_ok_per_s: float
    refused: int
    refused_p50_ms: float
    refused_p99_ms: float
    admitted: int  # probe calls that found a free place (a load caller between two calls)


def measure_refusal_probe(*, target: str, holders: int, window: Window) -> ProbeResult:
    """`holders` = N + Q of the server under test: that many load callers keep it full."""

    def client(callers: int) -> list[str]:
        return [
            PYTHON, "-m", "bench.closed_loop", "--protocol", "grpc", "--target", target,
            "--callers", str(callers), "--timeout-s", str(window.timeout_s),
        ]  # fmt: skip

    with ExitStack() as stack:
        load = stack.enter_context(ChildProcess("load", client(holders), stdin=True))
        probe = stack.enter_context(ChildProcess("probe", client(1), stdin=True))
        for child in (load, probe):
            child.wait_for(r"^ready$", 60.0)
        t0 = time.time() + window.warmup_s
        t1 = t0 + window.duration_s
        for child in (load, probe):
            child.send(f"START {t0:.6f} {t1:.6f}")
        load_record, probe_record = (
            json.loads(child.wait_for(r"^RESULT (.*)$", window.warmup_s + window.duration_s + 60.0).group(1))
            for child in (load, probe)
        )
    refused = probe_record["refused_ms"]
    return ProbeResult(
        load_ok_per_s=len(load_record["ok_ms"]) / window.duration_s,
        refused=len(refused),
        refused_p50_ms=percentile(refused, 50),
        refused_p99_ms=percentile(refused, 99),
        admitted=len(probe_record["ok_ms"]),
    )
