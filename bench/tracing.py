"""Tracing's cost (issue 22, acceptance 2): the same server with tracing off, and on at sampling 1.0 (every
call a sampled trace, its spans exported over OTLP/gRPC to bench.otlp_sink, which acknowledges each
export without parsing it, so the collector's own work is not counted), both running, measured in
alternation so that other load on the machine hits both alike: Infer calls/s at 64 closed-loop callers
(bench.closed_loop processes) and Generate tokens/s at 32 streams. Medians of repeats with their range,
per-repeat ratios on/off; target >= 0.95 for both.

    .venv/bin/python -m bench.tracing [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import psutil

from bench import plot
from bench.generate import Run, concurrent, percentile, spread
from bench.points import PointResult, Window, measure_point
from bench.processes import PYTHON, ChildProcess
from bench.stack import SluiceServer

BAR = 0.95


class Sink:
    """bench.otlp_sink in a process of its own: a gRPC server in this one would make every client process
    forked later restart gRPC's poller between fork and exec, which now and then aborts the child."""

    def __init__(self) -> None:
        self.process = ChildProcess("otlp-sink", [PYTHON, "-m", "bench.otlp_sink"])
        self.port = int(self.process.wait_for(r"otlp sink listening on (\d+)", 60.0).group(1))

    def received(self) -> tuple[int, int]:
        """(exports, bytes) so far."""
        sizes = [int(line.split()[1]) for line in list(self.process.lines) if line.startswith("EXPORT ")]
        return len(sizes), sum(sizes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, short windows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--callers", type=int, default=64, help="Infer closed-loop callers")
    parser.add_argument("--streams", type=int, default=32, help="concurrent Generate streams")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--duration-s", type=float, default=5.0, help="Infer window")
    parser.add_argument(
        "--sampling", type=float, default=1.0, help="the traced server's --otlp-sampling-ratio"
    )
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    window = Window(warmup_s=1.0 if args.quick else 1.5, duration_s=2.0 if args.quick else args.duration_s,
                    timeout_s=10.0, client_procs=1)  # fmt: skip
    tokens = 64 if args.quick else args.tokens
    sink = Sink()
    flags = ["--models", "mlp,byte-lm", "--model-options", "byte-lm.size=bench", "--max-sequences", "32",
             "--max-queue", "256", "--context-length", "512"]  # fmt: skip
    traced = ["--otlp-endpoint", f"127.0.0.1:{sink.port}", "--otlp-sampling-ratio", str(args.sampling)]
    infer: dict[str, list[PointResult]] = {"off": [], "on": []}
    generate: dict[str, list[Run]] = {"off": [], "on": []}
    print(
        f"tracing off vs on (sampling {args.sampling:g}, OTLP/gRPC to a sink that does not parse): Infer mlp "
        f"at {args.callers} callers ({window.duration_s:g} s windows), Generate byte-lm size=bench at "
        f"{args.streams} streams x {tokens} tokens; {repeats} repeat(s), sides alternating"
    )
    servers = {"off": SluiceServer(*flags), "on": SluiceServer(*flags, *traced)}
    try:
        for server in servers.values():
            asyncio.run(concurrent(server.target, 4, 16))  # warm the paths
        for repeat in range(repeats):
            order = ("off", "on") if repeat % 2 == 0 else ("on", "off")  # neither side always goes first
            for side in order:
                server = servers[side]
                # The export process's CPU counts as the server's: it is the work tracing adds.
                pids = [server.pid, *(c.pid for c in psutil.Process(server.pid).children(recursive=True))]
                infer[side].append(
                    measure_point(
                        protocol="grpc", target=server.target, service_pids=pids,
                        callers=args.callers, window=window,
                    )
                )  # fmt: skip
                generate[side].append(asyncio.run(concurrent(server.target, args.streams, tokens)))
    finally:
        for server in servers.values():
            server.stop()
        exports = sink.received()
        sink.process.stop()
    report(infer, generate, args, exports)


def report(
    infer: dict[str, list[PointResult]], generate: dict[str, list[Run]], args: Any, exports: tuple[int, int]
) -> None:
    print(f"\nspans exported to the sink: {exports[0]} exports, {exports[1] / 1e6:.1f} MB (tracing on only)")
    print("\nmedian [min-max] of repeats")
    print(f"{'side':>5} {'Infer ok/s':>20} {'Infer p99 ms':>18} {'server cores':>16} {'Generate tok/s':>20} "
          f"{'TTFT p50 ms':>18}")  # fmt: skip
    for side in ("off", "on"):
        points, runs = infer[side], generate[side]
        cells = [
            spread([p.ok_per_s for p in points]),
            spread([p.ok_p99_ms for p in points], 1, 1),
            spread([p.service_cores for p in points], 1, 2),
            spread([r.tokens_per_s for r in runs]),
            spread([percentile(r.ttft, 50) for r in runs], 1000, 1),
        ]
        print(f"{side:>5} {cells[0]:>20} {cells[1]:>18} {cells[2]:>16} {cells[3]:>20} {cells[4]:>18}")
    infer_ratio = [on.ok_per_s / off.ok_per_s for on, off in zip(infer["on"], infer["off"], strict=True)]
    gen_ratio = [
        on.tokens_per_s / off.tokens_per_s for on, off in zip(generate["on"], generate["off"], strict=True)
    ]
    cpu_off = [p.service_cores / p.ok_per_s * 1e6 for p in infer["off"]]
    cpu_on = [p.service_cores / p.ok_per_s * 1e6 for p in infer["on"]]
    print(
        f"\nserver CPU per Infer call (its export process too): off {spread(cpu_off)} us, "
        f"on {spread(cpu_on)} us"
    )
    print("\ntargets (per-repeat ratios on/off):")
    for name, ratios in (
        (f"Infer @ {args.callers} callers", infer_ratio),
        (f"Generate @ {args.streams} streams", gen_ratio),
    ):
        median = statistics.median(ratios)
        verdict = "met" if median >= BAR else "MISSED"
        print(f"  tracing on / off, {name}: {spread(ratios, digits=3)} (bar >= {BAR}) -> {verdict}")
    plot.draw(
        "tracing",
        [
            plot.Panel(
                f"Infer calls/s at {args.callers} callers",
                "calls/s",
                {side: {args.callers: [p.ok_per_s for p in infer[side]]} for side in infer},
            ),
            plot.Panel(
                f"Generate tokens/s at {args.streams} streams",
                "tokens/s",
                {side: {args.streams: [r.tokens_per_s for r in generate[side]]} for side in generate},
            ),
        ],
        x_label="load (callers or streams)",
        title=f"bench.tracing: tracing off vs on at sampling {args.sampling:g}",
    )


if __name__ == "__main__":
    main()
