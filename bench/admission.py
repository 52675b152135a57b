"""The admission-control benchmark (issues 3 and 12): Sluice over gRPC against a naive FastAPI service, a
plain grpc.aio server with the common dynamic batcher (bench.plain_batcher), the bare grpc.aio no-op server
(bench.noop_grpc) and the raw model loop, side by side under closed-loop callers on loopback.

    .venv/bin/python -m bench.admission [--quick] [--duration-s 5] [--repeats 3] [--callers 1,16,64,256]

Every service is driven by the Python clients and, where installed, by h2load. Repeats are interleaved (raw,
then every side, then the next repeat) so that drift on a shared machine lands on every side alike; ratios
are taken per repeat and summarised as median [min-max] (bench.admission_report prints them, with the
targets and the server CPU per call outside the forward pass).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import dataclass

import torch

from bench.admission_report import RawLoop, print_probes, print_report
from bench.h2load_point import h2load_path, measure_h2load_point
from bench.points import PointResult, Window, machine_busy_seconds, measure_point, wait_for_quiet
from bench.processes import PYTHON, ChildProcess
from bench.raw_model import raw_items_per_s
from bench.refusal_probe import ProbeResult, measure_refusal_probe

RAW_BATCH = 32
SMALL = {"slots": 16, "queue": 16}  # a Sluice that refuses at 256 callers, to show refusals


@dataclass(frozen=True, slots=True)
class Side:
    key: str
    label: str
    protocol: str
    command: list[str]
    ready: str  # regex of the line that says the service takes work
    listening: str  # regex whose group 1 is the port
    callers: tuple[int, ...]
    metrics: str | None = (
        None  # regex whose group 1 is the server's metrics port (h2load reads outcomes there)
    )


def small_server(args: argparse.Namespace) -> list[str]:
    return [
        PYTHON, "-m", "server", "--port", "0", "--models", "mlp", "--torch-threads", str(args.torch_threads),
        "--metrics-port", "-1", "--max-batch-size", str(SMALL["slots"]),
        "--max-concurrency", str(SMALL["slots"]), "--max-queue", str(SMALL["queue"]),
    ]  # fmt: skip


def run_probe(args: argparse.Namespace, window: Window) -> ProbeResult:
    """The refusal probe against a fresh small server, held full by N + Q callers."""
    with ChildProcess("probe-server", small_server(args)) as service:
        port = service.wait_for(r"listening on [^:]+:(\d+)", 120.0).group(1)
        service.wait_for(r"sluice server ready", 300.0)
        wait_for_quiet(threshold_cores=args.quiet_cores, max_wait_s=args.quiet_wait_s, ours=[service.pid])
        result = measure_refusal_probe(
            target=f"127.0.0.1:{port}", holders=SMALL["slots"] + SMALL["queue"], window=window
        )
    print(
        f"    refusal probe: {result.refused} refused, p50 {result.refused_p50_ms:.1f} ms, "
        f"p99 {result.refused_p99_ms:.1f} ms",
        flush=True,
    )
    return result


def sides(args: argparse.Namespace) -> list[Side]:
    threads = str(args.torch_threads)
    base = [PYTHON, "-m", "server", "--port", "0", "--models", "mlp", "--torch-threads", threads]
    tuned = ["--max-batch-size", "32", "--max-concurrency", "64", "--max-queue", "256"]
    grpc_ready, port = r"sluice server ready", r"listening on [^:]+:(\d+)"
    naive = [PYTHON, "-m", "bench.naive_service", "--port", "0", "--torch-threads", threads]
    naive_ready = r"naive service ready"
    no_metrics = ["--metrics-port", "-1"]
    # The gRPC baselines: what a team writes in an afternoon, and grpc.aio doing no work at all.
    plain = [PYTHON, "-m", "bench.plain_batcher", "--port", "0", "--torch-threads", threads]
    noop = [PYTHON, "-m", "bench.noop_grpc", "--port", "0"]
    # The same MLP as a user's plugin serves it: eager, not traced (the plain batcher runs it so too).
    eager = [*base, "--plugins", "bench.eager_mlp"]
    plain_ready, noop_ready = r"plain batcher ready", r"noop grpc ready"
    out = [
        Side(
            "sluice", "sluice gRPC (tuned)", "grpc", base + no_metrics + tuned, grpc_ready, port, args.callers
        ),
        Side(
            "sluice-eager",
            "sluice gRPC (tuned), eager plugin",
            "grpc",
            eager + no_metrics + tuned,
            grpc_ready,
            port,
            args.callers,
        ),
        Side("naive", "naive FastAPI", args.http_client, naive, naive_ready, port, args.callers),
        Side("plain", "plain gRPC batcher", "grpc", plain, plain_ready, port, args.callers),
        Side("noop", "no-op gRPC", "grpc", noop, noop_ready, port, args.callers),
    ]
    if args.h2load:
        metrics = r"\(metrics http://[^:]+:(\d+)/metrics\)"
        with_metrics = ["--metrics-port", "0"]
        out += [
            Side(
                "sluice-h2load",
                "sluice gRPC (tuned), h2load",
                "h2load-grpc",
                base + with_metrics + tuned,
                grpc_ready,
                port,
                args.callers,
                metrics,
            ),
            Side(
                "sluice-eager-h2load",
                "sluice gRPC (tuned), eager plugin, h2load",
                "h2load-grpc",
                eager + with_metrics + tuned,
                grpc_ready,
                port,
                args.callers,
                metrics,
            ),
            Side(
                "naive-h2load", "naive FastAPI, h2load", "h2load-http", naive, naive_ready, port, args.callers
            ),
            # No metrics port: the baselines never refuse, so h2load's HTTP statuses are the outcomes.
            Side(
                "plain-h2load",
                "plain gRPC batcher, h2load",
                "h2load-grpc",
                plain,
                plain_ready,
                port,
                args.callers,
            ),
            Side("noop-h2load", "no-op gRPC, h2load", "h2load-grpc", noop, noop_ready, port, args.callers),
        ]
    # Tuned Sluice never refuses at these caller counts (64 slots + 256 waiting): a small one shows refusals.
    small = ["--max-batch-size", "16", "--max-concurrency", "16", "--max-queue", "16"]
    label = "sluice gRPC (N=16, Q=16)"
    out.append(
        Side("small", label, "grpc", base + no_metrics + small, grpc_ready, port, (max(args.callers),))
    )
    if not args.skip_defaults:
        defaults = (max(args.callers),)
        out.append(
            Side("defaults", "sluice gRPC (defaults)", "grpc", base + no_metrics, grpc_ready, port, defaults)
        )
    if args.sides:
        unknown = set(args.sides) - {side.key for side in out}
        if unknown:
            raise ValueError(f"unknown --sides {sorted(unknown)}; known: {[side.key for side in out]}")
        out = [side for side in out if side.key in args.sides]
    return out


def run_side(
    side: Side, window: Window, notes: dict[str, str], args: argparse.Namespace
) -> dict[int, PointResult]:
    out: dict[int, PointResult] = {}
    with ChildProcess(side.key, side.command) as service:
        listening = service.wait_for(side.listening, 120.0)
        port = listening.group(1)
        metrics = re.search(side.metrics, listening.string) if side.metrics else None  # on the same line
        metrics_port = int(metrics.group(1)) if metrics else None
        service.wait_for(side.ready, 300.0)
        capacity = next((line for line in service.tail if "capacity for" in line), None)
        if capacity and "--max-concurrency" not in side.command:
            notes[side.key] = capacity.split(": ", 1)[-1]
        for callers in side.callers:
            wait_for_quiet(threshold_cores=args.quiet_cores, max_wait_s=args.quiet_wait_s, ours=[service.pid])
            target = f"127.0.0.1:{port}"
            if side.protocol.startswith("h2load"):
                out[callers] = measure_h2load_point(
                    protocol=side.protocol,
                    target=target,
                    service_pids=[service.pid],
                    metrics_port=metrics_port,
                    callers=callers,
                    window=window,
                )
            else:
                out[callers] = measure_point(
                    protocol=side.protocol,
                    target=target,
                    service_pids=[service.pid],
                    callers=callers,
                    window=window,
                )
            print(
                f"    {side.label} @ {callers:>3} callers: {out[callers].ok_per_s:7.0f} ok/s, "
                f"{out[callers].refused_per_s:7.0f} refused/s",
                flush=True,
            )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.admission",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration-s", type=float, default=None, help="measurement window per point (5)")
    parser.add_argument("--warmup-s", type=float, default=None, help="load before each window (1.5)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per point (3)")
    parser.add_argument("--callers", default="1,16,64,256", help="comma-separated caller counts")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="for every side (1: the server default on 2 cores)"
    )
    parser.add_argument("--client-procs", type=int, default=1, help="load-generator processes per point (1)")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="per-call deadline (10)")
    parser.add_argument(
        "--http-client",
        choices=("http", "httpx"),
        default="http",
        help="naive side's load generator: http = keep-alive HTTP/1.1 on asyncio streams (cheap), httpx",
    )
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="before each point, wait for other load below this (0.3)",
    )
    parser.add_argument("--quiet-wait-s", type=float, default=10.0, help="but no longer than this (10)")
    parser.add_argument("--skip-defaults", action="store_true", help="skip Sluice with default settings")
    parser.add_argument(
        "--sides",
        default="",
        help="comma-separated side keys to run (e.g. sluice-h2load,sluice-eager-h2load,plain-h2load); all",
    )
    parser.add_argument("--skip-probe", action="store_true", help="skip the refusal probe")
    parser.add_argument(
        "--load-generator",
        choices=("both", "python"),
        default="both",
        help="both: also drive each service with h2load (C; Debian nghttp2-client) when it is installed",
    )
    parser.add_argument("--quick", action="store_true", help="2 s windows, 1 s warm-up, 1 repeat")
    args = parser.parse_args(argv)
    args.callers = tuple(int(c) for c in args.callers.split(",") if c.strip())
    args.sides = tuple(s.strip() for s in args.sides.split(",") if s.strip())
    args.h2load = args.load_generator == "both" and h2load_path() is not None
    quick = args.quick
    args.duration_s = args.duration_s or (2.0 if quick else 5.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if quick else 1.5)
    args.repeats = args.repeats or (1 if quick else 3)
    if not args.callers or min(args.callers) < 1 or args.repeats < 1 or args.duration_s <= 0:
        raise ValueError("need caller counts >= 1, --repeats >= 1 and --duration-s > 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    window = Window(args.warmup_s, args.duration_s, args.timeout_s, args.client_procs)
    plan = sides(args)
    labels = {s.key: s.label for s in plan}
    results: dict[str, dict[int, list[PointResult]]] = {s.key: {c: [] for c in s.callers} for s in plan}
    raw: list[float] = []
    raw_cores: list[float] = []
    raw_other: list[float] = []
    probes: list[ProbeResult] = []
    notes: dict[str, str] = {}
    load_before = os.getloadavg()
    started = time.monotonic()
    for repeat in range(args.repeats):
        print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
        wait_for_quiet(threshold_cores=args.quiet_cores, max_wait_s=args.quiet_wait_s, ours=[])
        busy, own, wall = machine_busy_seconds(), time.process_time(), time.monotonic()
        raw.append(
            raw_items_per_s(width=2048, batch=RAW_BATCH, warmup_s=args.warmup_s, duration_s=args.duration_s)
        )
        own, wall = time.process_time() - own, time.monotonic() - wall
        raw_cores.append(own / wall)
        raw_other.append(max(machine_busy_seconds() - busy - own, 0.0) / wall)
        print(f"    raw model loop, batch {RAW_BATCH}: {raw[-1]:7.0f} items/s", flush=True)
        for side in plan[repeat % len(plan) :] + plan[: repeat % len(plan)]:  # rotate: no side always first
            for callers, point in run_side(side, window, notes, args).items():
                results[side.key][callers].append(point)
        if not args.skip_probe:
            probes.append(run_probe(args, window))
    elapsed = time.monotonic() - started
    raw_loop = RawLoop(RAW_BATCH, raw, raw_cores, raw_other)
    print_report(args, results, labels, raw_loop, notes, load_before, elapsed)
    print_probes(probes, slots=SMALL["slots"], queue=SMALL["queue"])


if __name__ == "__main__":
    main()
