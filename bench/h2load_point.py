"""One measured point driven by h2load (nghttp2's C load generator) instead of the Python clients.

On a 2-core machine the load generator shares the cores with the service: the Python grpc.aio client spends
about 0.14 ms of CPU per call, a quarter of a core at 2,000 calls/s, which remote callers would not take from
the server. h2load spends a tenth of that, so its rows show what the service itself can do (the role
Triton's perf_analyzer or ghz play elsewhere). Both rows are printed side by side.

h2load speaks HTTP/2 (gRPC: one pre-framed InferRequest, `content-type: application/grpc`) or HTTP/1.1 (the
naive service's JSON). Its per-request log gives the HTTP status and latency; a gRPC status travels in
trailers it does not read, so for Sluice over gRPC the outcome counts come from the server's Prometheus
counters (refusals by reason, items computed) over the same window; the gRPC baselines, which never refuse,
are counted by HTTP status alone.
"""

from __future__ import annotations

import math
import shutil
import struct
import tempfile
import time
from pathlib import Path

from bench.callers import INFER_METHOD, http_request, infer_request_bytes
from bench.points import PointResult, Window, cpu_seconds, machine_busy_seconds
from bench.processes import ChildProcess
from bench.prometheus import Samples, scrape, total
from bench.stats import percentile

STREAMS_PER_CONNECTION = 64  # gRPC multiplexes callers on one connection; beyond 64, open another


def h2load_path() -> str | None:
    """Where h2load is (Debian: `apt-get install nghttp2-client`), or None."""
    return shutil.which("h2load")


def _body(
    protocol: str, folder: Path, http_api: str, grpc_call: tuple[str, bytes] | None
) -> tuple[str, Path]:
    """(URL path, file holding the request body)."""
    path = folder / f"body-{protocol}"
    if protocol == "h2load-grpc":
        method, message = grpc_call or (INFER_METHOD, infer_request_bytes())
        path.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)  # the gRPC length prefix
        return method, path
    url_path, body = http_request(http_api)
    path.write_bytes(body)
    return url_path, path


def _command(
    protocol: str, target: str, callers: int, window: Window, request: tuple[str, Path], log: Path
) -> list[str]:
    h2load = h2load_path()
    if h2load is None:
        raise RuntimeError("h2load is not installed (Debian package nghttp2-client)")
    ms = {"duration": round(window.duration_s * 1000), "warmup": round(window.warmup_s * 1000)}
    timing = ["-D", f"{ms['duration']}ms", f"--warm-up-time={ms['warmup']}ms", f"--log-file={log}"]
    if protocol == "h2load-grpc":
        connections = math.ceil(callers / STREAMS_PER_CONNECTION)
        if callers % connections:
            raise ValueError(f"h2load needs callers ({callers}) divisible into {connections} connections")
        shape = ["-c", str(connections), "-m", str(callers // connections)]
        headers = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    else:
        shape = ["--h1", "-c", str(callers), "-m", "1"]  # HTTP/1.1: one request at a time per connection
        headers = ["-H", "content-type: application/json"]
    url_path, body = request
    return [h2load, *shape, *timing, "-d", str(body), *headers, f"http://{target}{url_path}"]


def _server_counts(samples: Samples, method: str) -> tuple[float, float, float, float]:
    """(refused, items computed, batches, compute seconds) as cumulative counters: refusals of `method`
    (Infer, or v2 ModelInfer), the batcher's work for every tensor model."""
    return (
        total(samples, "sluice_requests_refused_total", method=method),
        total(samples, "sluice_batch_size_sum", method="Infer"),
        total(samples, "sluice_batch_size_count", method="Infer"),
        total(samples, "sluice_compute_seconds_sum", method="Infer"),
    )


def measure_h2load_point(
    *,
    protocol: str,
    target: str,
    service_pids: list[int],
    metrics_port: int | None,
    callers: int,
    window: Window,
    http_api: str = "naive",
    grpc_call: tuple[str, bytes] | None = None,
    refused_method: str = "Infer",
) -> PointResult:
    """protocol: `h2load-grpc` or `h2load-http` (the naive service).

    For Sluice over gRPC pass its metrics_port: refusals are HTTP 200 to h2load and only the server's
    counters tell them apart. The gRPC baselines (bench.plain_batcher, bench.noop_grpc) have no metrics and
    never refuse: with metrics_port None every HTTP 200 counts as OK. `grpc_call` (method path, message
    bytes) replaces Sluice's own Infer (bench/kserve.py sends v2 ModelInfer), whose refusals the server
    counts under `refused_method`.
    """
    grpc = protocol == "h2load-grpc"
    with tempfile.TemporaryDirectory(prefix="sluice-h2load-") as tmp:
        log = Path(tmp) / "requests.log"
        command = _command(
            protocol, target, callers, window, _body(protocol, Path(tmp), http_api, grpc_call), log
        )
        with ChildProcess("h2load", command) as client:
            client.wait_for(r"Main benchmark duration is started", window.warmup_s + 60.0)
            t0 = time.time()
            before = _server_counts(scrape(metrics_port), refused_method) if grpc and metrics_port else None
            start = (
                time.monotonic(),
                machine_busy_seconds(),
                cpu_seconds(service_pids),
                cpu_seconds([client.pid]),
            )
            time.sleep(window.duration_s)
            end = (
                time.monotonic(),
                machine_busy_seconds(),
                cpu_seconds(service_pids),
                cpu_seconds([client.pid]),
            )
            after = _server_counts(scrape(metrics_port), refused_method) if grpc and metrics_port else None
            client.wait_for(r"^requests: ", window.timeout_s + 60.0)
            client.proc.wait(30.0)  # its log file is complete once it has exited
        rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    wall, busy, service_cpu, client_cpu = (e - s for e, s in zip(end, start, strict=True))
    t1 = t0 + window.duration_s
    # Log lines: start (µs since the epoch), HTTP status, latency (µs); keep calls that ended in the window.
    in_window = [(int(s), int(us) / 1000) for began, s, us in rows if t0 <= (int(began) + int(us)) / 1e6 < t1]
    ok_ms = [ms for status, ms in in_window if 200 <= status < 300]
    refused_ms = [ms for status, ms in in_window if status == 503]
    errors: dict[str, int] = {}
    for status, _ in in_window:
        if not (200 <= status < 300 or status == 503):
            errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
    mean_batch = compute_ms = float("nan")
    refused = len(refused_ms)
    if before is not None and after is not None:
        refused_d, items_d, batches_d, compute_d = (a - b for a, b in zip(after, before, strict=True))
        # A refused gRPC call is still HTTP 200 to h2load: the server's counters say how many there were.
        refused = round(refused_d)
        ok_ms = ok_ms[: max(len(ok_ms) - refused, 0)]
        if items_d < 0.9 * len(ok_ms):
            errors["answered without a forward pass (gRPC errors h2load cannot see)"] = len(ok_ms) - round(
                items_d
            )
        mean_batch = items_d / batches_d if batches_d else float("nan")
        compute_ms = 1000 * compute_d / batches_d if batches_d else float("nan")
    return PointResult(
        ok_per_s=len(ok_ms) / window.duration_s,
        refused_per_s=refused / window.duration_s,
        refused=refused,
        errors=errors,
        ok_p50_ms=percentile(ok_ms, 50),
        ok_p99_ms=percentile(ok_ms, 99),
        refused_p50_ms=percentile(refused_ms, 50),
        refused_p99_ms=percentile(refused_ms, 99),
        mean_batch=mean_batch,
        compute_ms=compute_ms,
        batch_wait_ms=float("nan"),
        service_cores=service_cpu / wall,
        client_cores=client_cpu / wall,
        other_cores=max(busy - service_cpu - client_cpu, 0.0) / wall,
        unfinished=0,
    )
