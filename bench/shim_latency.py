"""What the shim adds to a unary call (issue 7, acceptance 3): the same Infer (mlp, 512 float32) straight
over gRPC and through the shim's native JSON route, side by side in one run, at 1 and 16 callers, driven
by h2load (C: HTTP/2 gRPC frames, or HTTP/1.1 JSON) and by the Python clients.

    .venv/bin/python -m bench.shim_latency [--quick] [--repeats 3] [--duration-s 4] [--callers 1,16]

Added latency = p50 through the shim - p50 direct, paired per load generator and repeat; the target is
under 1 ms at 1 caller. Sides are interleaved within each repeat and the order rotates between repeats.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from bench import plot
from bench.h2load_point import h2load_path, measure_h2load_point
from bench.points import PointResult, Window, measure_point, wait_for_quiet
from bench.stack import SluiceServer, SluiceShim, running
from bench.stats import Spread

SERVER_FLAGS = ("--models", "mlp", "--max-concurrency", "64", "--max-queue", "256")


@dataclass(frozen=True, slots=True)
class Side:
    key: str  # e.g. "h2load direct"
    generator: str  # h2load | python
    path: str  # direct | shim


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measure(side: Side, callers: int, window: Window, stack: tuple[SluiceServer, SluiceShim]) -> PointResult:
    server, shim = stack
    target = server.target if side.path == "direct" else f"127.0.0.1:{shim.port}"
    pids = [server.pid] if side.path == "direct" else [shim.pid, server.pid]
    if side.generator == "h2load":
        return measure_h2load_point(
            protocol="h2load-grpc" if side.path == "direct" else "h2load-http",
            target=target,
            service_pids=pids,
            metrics_port=server.metrics_port if side.path == "direct" else None,
            callers=callers,
            window=window,
            http_api="sluice",
        )
    return measure_point(
        protocol="grpc" if side.path == "direct" else "http",
        target=target,
        service_pids=pids,
        callers=callers,
        window=window,
        http_api="sluice",
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    window = Window(args.warmup_s, args.duration_s, 10.0, 1)
    generators = ["h2load", "python"] if h2load_path() else ["python"]
    sides = [Side(f"{g} {p}", g, p) for g in generators for p in ("direct", "shim")]
    results: dict[tuple[str, int], list[PointResult]] = {(s.key, c): [] for s in sides for c in args.callers}
    started = time.monotonic()
    with running(*SERVER_FLAGS) as stack:
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
            order = sides[repeat % len(sides) :] + sides[: repeat % len(sides)]
            for callers in args.callers:
                for side in order:
                    wait_for_quiet(threshold_cores=0.3, max_wait_s=10.0, ours=[stack[0].pid, stack[1].pid])
                    point = measure(side, callers, window, stack)
                    results[(side.key, callers)].append(point)
                    errors = f", errors {point.errors}" if point.errors else ""
                    print(
                        f"    {side.key:>13} @ {callers:>2}: {point.ok_per_s:6.0f} ok/s, p50 "
                        f"{point.ok_p50_ms:6.2f} ms{errors}",
                        flush=True,
                    )
    report(args, generators, results, time.monotonic() - started)


def report(
    args: argparse.Namespace,
    generators: list[str],
    results: dict[tuple[str, int], list[PointResult]],
    elapsed_s: float,
) -> None:
    print()
    print(f"CPU: {cpu_model()}; run took {elapsed_s:.0f} s")
    print(
        f"the same Infer (mlp, 512 float32: gRPC raw bytes direct, a JSON list through the shim); "
        f"{args.duration_s:g} s windows after {args.warmup_s:g} s warm-up; {args.repeats} repeats; cells are "
        "median [min-max]; 'svc cores' counts the shim and the server on the shim rows"
    )
    print(f"{'side':>16} {'callers':>7}  {'ok/s':>16}  {'p50 ms':>16}  {'p99 ms':>16}  {'svc cores':>16}")
    for (key, callers), points in results.items():
        cells = [
            Spread.of([p.ok_per_s for p in points]).format(0),
            Spread.of([p.ok_p50_ms for p in points]).format(2),
            Spread.of([p.ok_p99_ms for p in points]).format(2),
            Spread.of([p.service_cores for p in points]).format(2),
        ]
        print(f"{key:>16} {callers:>7}  " + "  ".join(f"{c:>16}" for c in cells))
    by_side: dict[str, dict[float, list[PointResult]]] = {}
    for (key, callers), points in results.items():
        by_side.setdefault(key, {})[callers] = points
    plot.draw(
        "shim_latency",
        [
            plot.Panel(
                "answered calls/s",
                "calls/s",
                {k: {c: [p.ok_per_s for p in ps] for c, ps in v.items()} for k, v in by_side.items()},
            ),
            plot.Panel(
                "ok p50 latency",
                "ms",
                {k: {c: [p.ok_p50_ms for p in ps] for c, ps in v.items()} for k, v in by_side.items()},
            ),
        ],
        x_label="closed-loop callers",
        title="bench.shim_latency: the same Infer direct over gRPC and through the shim",
    )
    print()
    print("added by the shim (shim - direct, paired per repeat):")
    for generator in generators:
        for callers in args.callers:
            direct, shim = results[(f"{generator} direct", callers)], results[(f"{generator} shim", callers)]
            added = Spread.of([s.ok_p50_ms - d.ok_p50_ms for d, s in zip(direct, shim, strict=True)])
            ratio = Spread.of(
                [s.ok_per_s / d.ok_per_s for d, s in zip(direct, shim, strict=True) if d.ok_per_s]
            )
            verdict = ""
            if callers == 1:
                verdict = (
                    "  [  MET  ] (target < 1 ms)" if added.median < 1.0 else "  [NOT MET] (target < 1 ms)"
                )
            print(
                f"  [{generator}] @ {callers:>2} callers: p50 +{added.format(2)} ms; "
                f"throughput shim/direct {ratio.format(2)}{verdict}"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.shim_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration-s", type=float, default=None, help="window per point (4; quick 2)")
    parser.add_argument("--warmup-s", type=float, default=None, help="load before each window (1)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (3; quick 1)")
    parser.add_argument("--callers", default="1,16", help="comma-separated caller counts")
    parser.add_argument("--quick", action="store_true", help="2 s windows, 1 repeat")
    args = parser.parse_args(argv)
    args.callers = tuple(int(c) for c in args.callers.split(",") if c.strip())
    args.duration_s = args.duration_s or (2.0 if args.quick else 4.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else 1.0
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


if __name__ == "__main__":
    main()
