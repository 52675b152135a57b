"""Front-end scaling (issue 12, acceptance 2): calls/s of the no-op model (bench/noop_model.py) through one
server process against `--frontends N`, under h2load, with the server's CPU (the engine and its front ends
together). Repeats interleave the settings; ratios are per repeat, median [min-max].

    .venv/bin/python -m bench.frontends [--quick] [--frontends 2] [--connections 4] [--streams 16]

h2load opens --connections connections with --streams calls in flight on each: the kernel spreads
connections over the front ends (SO_REUSEPORT), never the calls of one connection.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from sluice.inference.v1 import inference_pb2 as pb

from bench import plot
from bench.h2load_point import h2load_path
from bench.processes import PYTHON, ChildProcess
from bench.prometheus import scrape, total
from bench.stats import Spread

METHOD = "/sluice.inference.v1.InferenceService/Infer"


def body(folder: Path) -> Path:
    x = np.ones(512, np.float32)
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    message = pb.InferRequest(model="noop", inputs=[tensor]).SerializeToString()
    path = folder / "noop-body"
    path.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
    return path


def cpu_seconds(pid: int) -> float:
    """The process and its children (the front ends), user + system."""
    root = psutil.Process(pid)
    total_s = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total_s += times.user + times.system
    return total_s


def window(frontends: int, args: argparse.Namespace, request: Path) -> tuple[float, float]:
    """(calls/s, server cores) over one h2load window against a fresh server."""
    command = [
        PYTHON, "-m", "server", "--port", "0", "--metrics-port", "0", "--log-level", "WARNING",
        "--plugins", "bench.noop_model", "--models", "noop", "--max-concurrency", "256",
        "--max-queue", "256", "--frontends", str(frontends),
    ]  # fmt: skip
    with ChildProcess(f"server-{frontends}", command) as server:
        listening = server.wait_for(r"listening on [^:]+:(\d+) \(metrics http://[^:]+:(\d+)", 120.0)
        port, metrics_port = int(listening.group(1)), int(listening.group(2))
        server.wait_for(r"sluice server ready", 120.0)
        h2load = [
            str(h2load_path()), "-c", str(args.connections), "-m", str(args.streams),
            "-D", f"{args.seconds:g}", f"--warm-up-time={args.warmup_s:g}", "-d", str(request),
            "-H", "content-type: application/grpc", "-H", "te: trailers", f"http://127.0.0.1:{port}{METHOD}",
        ]  # fmt: skip
        client = subprocess.Popen(h2load, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(args.warmup_s)  # the load generator's own warm-up: nothing is measured in it
        before, started = cpu_seconds(server.pid), time.monotonic()
        out, _ = client.communicate(timeout=args.seconds + 60)
        cores = (cpu_seconds(server.pid) - before) / (time.monotonic() - started)
        refused = total(scrape(metrics_port), "sluice_requests_refused_total")
    found = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)
    ok = re.search(r"(\d+) succeeded, (\d+) failed", out)
    if found is None or ok is None or int(ok.group(2)) or refused:
        raise RuntimeError(f"the window failed ({refused:g} refused):\n{out}")
    return float(found.group(1)), cores


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat of 3 s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--frontends", type=int, default=2, help="compared against one process (2)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--streams", type=int, default=16, help="calls in flight per connection (16)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds = 1, 3.0
    if h2load_path() is None:
        raise SystemExit("h2load is not installed (Debian package nghttp2-client)")
    runs: dict[int, list[tuple[float, float]]] = {1: [], args.frontends: []}
    with tempfile.TemporaryDirectory() as scratch:
        request = body(Path(scratch))
        for repeat in range(args.repeats):
            for frontends in (1, args.frontends) if repeat % 2 == 0 else (args.frontends, 1):
                runs[frontends].append(window(frontends, args, request))
                print(f"  repeat {repeat + 1}, frontends {frontends}: {runs[frontends][-1][0]:.0f} calls/s",
                      flush=True)  # fmt: skip
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(": ")[-1] for line in info if line.startswith("model name")), "?")
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, {cpu.strip()}")
    print(
        f"no-op model, h2load {args.connections} connections x {args.streams} streams, {args.repeats} "
        f"repeat(s) of {args.seconds:g} s; median [min-max]"
    )
    for frontends, results in runs.items():
        label = "one process" if frontends == 1 else f"--frontends {frontends}"
        rate = Spread.of([r[0] for r in results]).format(0)
        cores = Spread.of([r[1] for r in results]).format(2)
        print(f"  {label:>14}: {rate} calls/s, server {cores} cores")
    connections = args.connections * args.streams
    plot.draw(
        "frontends",
        [
            plot.Panel(
                f"calls/s at {connections} calls in flight",
                "calls/s",
                {f"--frontends {n}": {connections: [r[0] for r in rs]} for n, rs in runs.items()},
            ),
            plot.Panel(
                "server CPU",
                "cores",
                {f"--frontends {n}": {connections: [r[1] for r in rs]} for n, rs in runs.items()},
            ),
        ],
        x_label="calls in flight (h2load)",
        title="bench.frontends: a no-op model, one process against several front ends",
    )
    ratios = [n[0] / one[0] for n, one in zip(runs[args.frontends], runs[1], strict=True)]
    median = statistics.median(ratios)
    verdict = "met" if median >= 1.6 else "MISSED"
    print(
        f"\ntarget: --frontends {args.frontends} / one process >= 1.6: {Spread.of(ratios).format(2)} "
        f"-> {verdict}"
    )


if __name__ == "__main__":
    main()
