"""The shim as a gateway (issue 9, acceptance 4), side by side in one run, medians and spread over repeats:

  (a) added latency of a unary Infer through the shim against gRPC direct, at 1 caller (target < 1 ms p50);
  (b) unary JSON throughput through the shim at 64 callers against a bare uvicorn endpoint that does no
      work (bench.noop_http, the HTTP stack's limit; target >= 0.8), with gRPC direct beside it;
  (c) streamed tokens/s at 32 fixed-length streams through the shim's OpenAI chat SSE against the same
      streams over gRPC (target >= 0.95);
  (d) the shim's CPU per streamed token.

h2load (C) drives every HTTP and gRPC side; the Python clients (grpc.aio, httpx) run beside it.

    .venv/bin/python -m bench.gateway [--quick] [--repeats 3] [--duration-s 4] [--shim-workers 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Callable

import psutil

from bench import plot
from bench.h2load_point import h2load_path, measure_h2load_point
from bench.points import PointResult, Window, measure_point, wait_for_quiet
from bench.processes import PYTHON, ChildProcess
from bench.shim_latency import Side, cpu_model
from bench.shim_latency import measure as measure_latency
from bench.stack import SluiceServer, SluiceShim
from bench.stats import Spread
from bench.stream_point import StreamPoint, measure_stream_point

SERVER_FLAGS = ("--models", "mlp,byte-lm", "--max-concurrency", "64", "--max-queue", "256")
UNARY_CALLERS = 64
STREAMS = 32
TOKENS = 64


def family(pid: int) -> list[int]:
    """A process and its children: the shim's workers under --workers N."""
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.window = Window(args.warmup_s, args.duration_s, 30.0, 1)
        self.generators = ["h2load", "python"] if h2load_path() else ["python"]
        self.unary: dict[str, list[PointResult]] = defaultdict(list)
        self.streams: dict[str, list[StreamPoint]] = defaultdict(list)

    def run(self, server: SluiceServer, shim: SluiceShim, noop: tuple[int, int]) -> None:
        ours = [server.pid, *family(shim.pid), noop[1]]
        for repeat in range(self.args.repeats):
            print(f"repeat {repeat + 1}/{self.args.repeats}", flush=True)
            for generator in self.generators:
                steps = [self._latency(generator, p, server, shim) for p in ("direct", "shim")]
                steps += [
                    self._throughput(generator, p, server, shim, noop) for p in ("direct", "shim", "noop")
                ]
                steps += [self._stream(generator, p, server, shim) for p in ("grpc", "sse")]
                for step in steps[repeat % 2 :] + steps[: repeat % 2]:  # the order alternates
                    wait_for_quiet(threshold_cores=0.3, max_wait_s=10.0, ours=ours)
                    step()

    def _latency(
        self, generator: str, path: str, server: SluiceServer, shim: SluiceShim
    ) -> Callable[[], None]:
        def step() -> None:
            point = measure_latency(
                Side(f"{generator} {path}", generator, path), 1, self.window, (server, shim)
            )
            self._record_unary(f"{generator} {path} @1", point)

        return step

    def _throughput(
        self, generator: str, path: str, server: SluiceServer, shim: SluiceShim, noop: tuple[int, int]
    ) -> Callable[[], None]:
        target = {"direct": server.target, "shim": f"127.0.0.1:{shim.port}", "noop": f"127.0.0.1:{noop[0]}"}[
            path
        ]
        pids = {"direct": [server.pid], "shim": [*family(shim.pid), server.pid], "noop": [noop[1]]}[path]

        def step() -> None:
            if generator == "h2load":
                point = measure_h2load_point(
                    protocol="h2load-grpc" if path == "direct" else "h2load-http", target=target,
                    service_pids=pids, metrics_port=server.metrics_port if path == "direct" else None,
                    callers=UNARY_CALLERS, window=self.window, http_api="sluice",
                )  # fmt: skip
            else:
                point = measure_point(
                    protocol="grpc" if path == "direct" else "http", target=target, service_pids=pids,
                    callers=UNARY_CALLERS, window=self.window, http_api="sluice",
                )  # fmt: skip
            self._record_unary(f"{generator} {path} @{UNARY_CALLERS}", point)

        return step

    def _stream(
        self, generator: str, path: str, server: SluiceServer, shim: SluiceShim
    ) -> Callable[[], None]:
        def step() -> None:
            point = measure_stream_point(
                generator=generator, path=path,
                target=server.target if path == "grpc" else f"127.0.0.1:{shim.port}",
                pids={"server": [server.pid], "shim": family(shim.pid)}, metrics_port=server.metrics_port,
                streams=STREAMS, tokens=TOKENS, window=self.window,
            )  # fmt: skip
            key = f"{generator} {path} x{STREAMS}"
            self.streams[key].append(point)
            print(
                f"    {key:>22}: {point.tokens_per_s:7.0f} tokens/s, {point.streams_done} streams, shim "
                f"{point.service_cores['shim']:.2f} cores, server {point.service_cores['server']:.2f}",
                flush=True,
            )

        return step

    def _record_unary(self, key: str, point: PointResult) -> None:
        self.unary[key].append(point)
        errors = f", errors {point.errors}" if point.errors else ""
        print(f"    {key:>22}: {point.ok_per_s:7.0f} ok/s, p50 {point.ok_p50_ms:6.2f} ms{errors}", flush=True)


def verdict(value: float, bar: float, *, below: bool = False) -> str:
    met = value < bar if below else value >= bar
    return (
        f"[  MET  ] (target {'<' if below else '>='} {bar:g})"
        if met
        else f"[NOT MET] (target {'<' if below else '>='} {bar:g})"
    )


def report(bench: Bench, elapsed_s: float) -> None:
    args = bench.args
    print()
    cores = psutil.cpu_count()
    print(f"CPU: {cpu_model()} ({cores} cores, load generators and service share them); {elapsed_s:.0f} s")
    pinning = "the server pinned to CPU 0, the rest to the others" if args.pin else "no pinning"
    print(
        f"{args.duration_s:g} s windows after {args.warmup_s:g} s warm-up; {args.repeats} repeats; shim "
        f"workers {args.shim_workers}; {pinning}; cells are median [min-max]"
    )
    print(f"{'unary side':>24}  {'ok/s':>18}  {'p50 ms':>18}  {'p99 ms':>18}  {'svc cores':>14}")
    for key, points in bench.unary.items():
        cells = [
            Spread.of([p.ok_per_s for p in points]).format(0),
            Spread.of([p.ok_p50_ms for p in points]).format(2),
            Spread.of([p.ok_p99_ms for p in points]).format(2),
            Spread.of([p.service_cores for p in points]).format(2),
        ]
        print(f"{key:>24}  " + "  ".join(f"{c:>18}" for c in cells[:3]) + f"  {cells[3]:>14}")
    print(f"{'stream side':>24}  {'tokens/s':>18}  {'shim cores':>18}  {'server cores':>18}")
    for key, streams in bench.streams.items():
        cells = [
            Spread.of([s.tokens_per_s for s in streams]).format(0),
            Spread.of([s.service_cores["shim"] for s in streams]).format(2),
            Spread.of([s.service_cores["server"] for s in streams]).format(2),
        ]
        print(f"{key:>24}  " + "  ".join(f"{c:>18}" for c in cells))
    draw(bench)
    print()
    for g in bench.generators:
        direct, shim = bench.unary[f"{g} direct @1"], bench.unary[f"{g} shim @1"]
        added = Spread.of([s.ok_p50_ms - d.ok_p50_ms for d, s in zip(direct, shim, strict=True)])
        met = verdict(added.median, 1.0, below=True)
        print(f"(a) [{g}] shim adds p50 +{added.format(2)} ms at 1 caller  {met}")
    for g in bench.generators:
        noop, shim = bench.unary[f"{g} noop @{UNARY_CALLERS}"], bench.unary[f"{g} shim @{UNARY_CALLERS}"]
        direct = bench.unary[f"{g} direct @{UNARY_CALLERS}"]
        ratio = Spread.of([s.ok_per_s / n.ok_per_s for n, s in zip(noop, shim, strict=True) if n.ok_per_s])
        of_direct = Spread.of(
            [s.ok_per_s / d.ok_per_s for d, s in zip(direct, shim, strict=True) if d.ok_per_s]
        )
        print(
            f"(b) [{g}] shim/noop ok/s at {UNARY_CALLERS} callers {ratio.format(2)}  "
            f"{verdict(ratio.median, 0.8)}; shim/direct gRPC {of_direct.format(2)}"
        )
    for g in bench.generators:
        grpc_side, sse = bench.streams[f"{g} grpc x{STREAMS}"], bench.streams[f"{g} sse x{STREAMS}"]
        ratio = Spread.of([s.tokens_per_s / d.tokens_per_s for d, s in zip(grpc_side, sse, strict=True)])
        print(
            f"(c) [{g}] SSE/gRPC tokens/s at {STREAMS} streams {ratio.format(2)}  "
            f"{verdict(ratio.median, 0.95)}"
        )
    for g in bench.generators:
        sse = bench.streams[f"{g} sse x{STREAMS}"]
        per_token = Spread.of(
            [1e6 * s.service_cpu_s["shim"] / (s.tokens_per_s * args.duration_s) for s in sse]
        )
        print(f"(d) [{g}] shim CPU per streamed token {per_token.format(1)} µs")


def draw(bench: Bench) -> None:
    """The PNG beside the tables: unary ok/s by side against callers, and tokens/s by side against streams
    (the sides' keys end in `@N` callers or `xN` streams)."""
    unary: dict[str, dict[float, list[float]]] = {}
    for key, points in bench.unary.items():
        side, _, callers = key.rpartition(" @")
        unary.setdefault(side, {})[float(callers)] = [p.ok_per_s for p in points]
    streamed: dict[str, dict[float, list[float]]] = {}
    for key, streams in bench.streams.items():
        side, _, count = key.rpartition(" x")
        streamed.setdefault(side, {})[float(count)] = [s.tokens_per_s for s in streams]
    plot.draw(
        "gateway",
        [plot.Panel("unary ok/s", "calls/s", unary), plot.Panel("streamed tokens/s", "tokens/s", streamed)],
        x_label="callers or streams",
        title="bench.gateway: the shim as OpenAI gateway, against gRPC direct and a no-op",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration-s", type=float, default=None, help="window per point (4; quick 2)")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="load before each window (1)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (3; quick 1)")
    parser.add_argument("--shim-workers", type=int, default=1, help="the shim's --workers (1)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the server on CPU 0, everything else (shim, noop endpoint, load generators) on the others, "
        "as when the shim runs on other cores or another host than the model",
    )
    parser.add_argument("--quick", action="store_true", help="2 s windows, 1 repeat")
    args = parser.parse_args(argv)
    args.duration_s = args.duration_s or (2.0 if args.quick else 4.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    bench = Bench(args)
    started = time.monotonic()
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        raise SystemExit("--pin needs at least two CPUs")
    if args.pin:  # children inherit the affinity of this process when they start
        os.sched_setaffinity(0, cpus[:1])
    server = SluiceServer(*SERVER_FLAGS)
    if args.pin:
        os.sched_setaffinity(0, cpus[1:])
    try:
        shim = SluiceShim(server.target, "--workers", str(args.shim_workers))
        try:
            with ChildProcess("noop", [PYTHON, "-m", "bench.noop_http"]) as noop:
                port = int(noop.wait_for(r"noop http listening on [\d.]+:(\d+)", 60.0).group(1))
                bench.run(server, shim, (port, noop.pid))
        finally:
            shim.stop(60.0)
    finally:
        server.stop(60.0)
    report(bench, time.monotonic() - started)


if __name__ == "__main__":
    main()
