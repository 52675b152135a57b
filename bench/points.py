"""One measured point: K load-generator processes, N closed-loop callers, one window, one PointResult.

The orchestrator hands every client process the same window, samples the CPU time of the service and of
the clients at its edges (they share the machine's cores), and merges what the clients recorded.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass

import psutil

from bench.processes import PYTHON, ChildProcess
from bench.stats import percentile


@dataclass(frozen=True, slots=True)
class Window:
    warmup_s: float
    duration_s: float
    timeout_s: float  # per-call deadline
    client_procs: int


@dataclass(frozen=True, slots=True)
class PointResult:
    ok_per_s: float
    refused_per_s: float
    refused: int
    errors: dict[str, int]
    ok_p50_ms: float
    ok_p99_ms: float
    refused_p50_ms: float
    refused_p99_ms: float
    mean_batch: float  # from sampled server timings; NaN where the protocol does not report them
    compute_ms: float  # mean forward-pass time per batch as the server timed it
    batch_wait_ms: float  # mean time from batcher queue to batch start (not the admission wait)
    service_cores: float  # CPU seconds per second of the service process during the window
    client_cores: float  # the same, summed over the load-generator processes
    other_cores: float  # busy CPU of the whole machine minus the two above: other tenants, the kernel
    unfinished: int


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle, all cores together, since boot."""
    times = psutil.cpu_times()
    guest = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)  # already counted in user
    busy: float = sum(times) - times.idle - getattr(times, "iowait", 0.0) - guest
    return busy


def wait_for_quiet(*, threshold_cores: float, max_wait_s: float, ours: list[int]) -> float:
    """Waits (at most max_wait_s) for a 1 s stretch in which processes other than `ours` and this one
    keep less than threshold_cores busy: other tenants of a shared machine come in bursts. Returns the
    last stretch's foreign load in cores."""
    me = os.getpid()
    deadline = time.monotonic() + max_wait_s
    while True:
        wall, busy, own = time.monotonic(), machine_busy_seconds(), cpu_seconds([*ours, me])
        time.sleep(1.0)
        wall = time.monotonic() - wall
        busy = machine_busy_seconds() - busy
        own = cpu_seconds([*ours, me]) - own
        foreign = max(busy - own, 0.0) / wall
        if foreign < threshold_cores or time.monotonic() >= deadline:
            return foreign


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _sleep_until(epoch_s: float) -> None:
    time.sleep(max(epoch_s - time.time(), 0.0))


def measure_point(
    *,
    protocol: str,
    target: str,
    service_pids: list[int],
    callers: int,
    window: Window,
    http_api: str = "naive",
) -> PointResult:
    procs = max(1, min(window.client_procs, callers))
    shares = [callers // procs + (1 if i < callers % procs else 0) for i in range(procs)]
    with ExitStack() as stack:
        clients = [
            stack.enter_context(
                ChildProcess(
                    f"client-{i}",
                    [
                        PYTHON, "-m", "bench.closed_loop", "--protocol", protocol, "--target", target,
                        "--callers", str(share), "--timeout-s", str(window.timeout_s), "--http-api", http_api,
                    ],
                    stdin=True,
                )
            )
            for i, share in enumerate(shares)
        ]  # fmt: skip
        for client in clients:
            client.wait_for(r"^ready$", 60.0)
        t0 = time.time() + window.warmup_s
        t1 = t0 + window.duration_s
        for client in clients:
            client.send(f"START {t0:.6f} {t1:.6f}")
        client_pids = [c.pid for c in clients]
        _sleep_until(t0)
        start = (time.time(), machine_busy_seconds(), cpu_seconds(service_pids), cpu_seconds(client_pids))
        _sleep_until(t1)
        end = (time.time(), machine_busy_seconds(), cpu_seconds(service_pids), cpu_seconds(client_pids))
        records = [json.loads(c.wait_for(r"^RESULT (.*)$", 60.0).group(1)) for c in clients]
    wall, busy, service_cpu, clients_cpu = (e - s for e, s in zip(end, start, strict=True))
    ok_ms = [v for r in records for v in r["ok_ms"]]
    refused_ms = [v for r in records for v in r["refused_ms"]]
    batches = [tuple(v) for r in records for v in r["batches"]]
    errors: dict[str, int] = {}
    for r in records:
        for name, count in r["errors"].items():
            errors[name] = errors.get(name, 0) + count
    return PointResult(
        ok_per_s=len(ok_ms) / window.duration_s,
        refused_per_s=len(refused_ms) / window.duration_s,
        refused=len(refused_ms),
        errors=errors,
        ok_p50_ms=percentile(ok_ms, 50),
        ok_p99_ms=percentile(ok_ms, 99),
        refused_p50_ms=percentile(refused_ms, 50),
        refused_p99_ms=percentile(refused_ms, 99),
        mean_batch=_mean([b[0] for b in batches]),
        compute_ms=_mean([b[1] for b in batches]),
        batch_wait_ms=_mean([b[2] for b in batches]),
        service_cores=service_cpu / wall,
        client_cores=clients_cpu / wall,
        other_cores=max(busy - service_cpu - clients_cpu, 0.0) / wall,
        unfinished=sum(r["unfinished"] for r in records),
    )
