"""The Open Inference Protocol against Sluice's own API, on the same server in the same run: MLP Infer at
1, 16 and 64 callers, driven by h2load (pre-framed messages: v2 ModelInfer against Sluice's InferRequest,
the service's own cost) and by the Python clients (tritonclient.grpc.aio from .venv-triton against
Sluice's AsyncSluiceClient: what a caller of each API pays too). Each repeat measures both APIs back to
back, alternating which goes first; rows give the median and [min-max] over the repeats, and the v2/own
ratio of each repeat's pair.

    flock /tmp/sluice-bench.lock .venv/bin/python -m bench.kserve --repeats 3
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from sluice.kserve.v2 import grpc_service_pb2 as v2

from bench import plot
from bench.callers import FEATURES, input_vector
from bench.h2load_point import h2load_path, measure_h2load_point
from bench.points import Window
from bench.processes import REPO_ROOT
from bench.stack import SluiceServer
from bench.stats import Spread

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
TRITON_PY = REPO_ROOT / ".venv-triton" / "bin" / "python"
APIS = ("own", "v2")


def model_infer_bytes() -> bytes:
    """The same 512 floats as bench.callers' InferRequest, as a v2 request with the batch dimension."""
    request = v2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, FEATURES])
    request.raw_input_contents.append(struct.pack(f"<{FEATURES}f", *input_vector()))
    return request.SerializeToString()


def h2load_point(server: SluiceServer, api: str, callers: int, window: Window) -> dict[str, float]:
    point = measure_h2load_point(
        protocol="h2load-grpc",
        target=server.target,
        service_pids=[server.pid],
        metrics_port=server.metrics_port,
        callers=callers,
        window=window,
        grpc_call=(MODEL_INFER, model_infer_bytes()) if api == "v2" else None,
        refused_method="ModelInfer" if api == "v2" else "Infer",
    )
    errors = sum(point.errors.values()) + point.refused
    return {
        "ok_per_s": point.ok_per_s,
        "p50_ms": point.ok_p50_ms,
        "p99_ms": point.ok_p99_ms,
        "errors": errors,
    }


def client_point(server: SluiceServer, api: str, callers: int, window: Window) -> dict[str, float]:
    if api == "v2":
        command = [str(TRITON_PY), str(REPO_ROOT / "bench" / "kserve_client.py"), "triton"]
    else:
        command = [sys.executable, "-m", "bench.kserve_client", "sluice"]
    command += [server.target, str(callers), str(window.warmup_s), str(window.duration_s)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,16,64", help="callers per point, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--loads", default="h2load,client", help="h2load, client or both")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "kserve.json")
    args = parser.parse_args()
    loads = args.loads.split(",")
    if "h2load" in loads and h2load_path() is None:
        raise SystemExit("h2load is not installed (Debian package nghttp2-client)")
    if "client" in loads and not TRITON_PY.exists():
        raise SystemExit(f"{TRITON_PY} is missing: bash scripts/setup_triton.sh")
    window = Window(warmup_s=args.warmup_s, duration_s=args.duration_s, timeout_s=30.0, client_procs=1)
    measure = {"h2load": h2load_point, "client": client_point}
    results: dict[str, list[dict[str, Any]]] = {}
    server = SluiceServer("--models", "mlp")
    try:
        for repeat in range(args.repeats):
            for callers in (int(c) for c in args.concurrency.split(",")):
                for load in loads:
                    order = APIS if repeat % 2 == 0 else APIS[::-1]
                    for api in order:
                        point = measure[load](server, api, callers, window)
                        results.setdefault(f"{load} {callers} {api}", []).append(point)
                        print(
                            f"repeat {repeat + 1} {load:6} {callers:3} callers {api:3}: {point}", flush=True
                        )
    finally:
        server.stop()
    report(results, loads, [int(c) for c in args.concurrency.split(",")])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


def report(results: dict[str, list[dict[str, Any]]], loads: list[str], concurrency: list[int]) -> None:
    print(
        "\nload    callers  own ok/s            v2 ok/s             v2/own             own p50 ms   v2 p50 ms"
    )
    for load in loads:
        for callers in concurrency:
            own, theirs = results[f"{load} {callers} own"], results[f"{load} {callers} v2"]
            ratios = [
                t["ok_per_s"] / o["ok_per_s"] for o, t in zip(own, theirs, strict=True) if o["ok_per_s"]
            ]
            cells = [
                Spread.of([p["ok_per_s"] for p in own]).format(),
                Spread.of([p["ok_per_s"] for p in theirs]).format(),
                Spread.of(ratios).format(2),
                Spread.of([p["p50_ms"] for p in own]).format(2),
                Spread.of([p["p50_ms"] for p in theirs]).format(2),
            ]
            print(f"{load:7} {callers:7}  " + "  ".join(f"{c:18}" for c in cells))
    panels = [
        plot.Panel(
            f"{load}: calls/s",
            "calls/s",
            {
                f"Sluice's Infer{' (AsyncSluiceClient)' if load == 'client' else ''}": {
                    c: [p["ok_per_s"] for p in results[f"{load} {c} own"]] for c in concurrency
                },
                f"v2 ModelInfer{' (tritonclient.grpc.aio)' if load == 'client' else ''}": {
                    c: [p["ok_per_s"] for p in results[f"{load} {c} v2"]] for c in concurrency
                },
            },
        )
        for load in loads
    ]
    plot.draw("kserve", panels, x_label="callers", title="KServe v2 against Sluice's own API (MLP Infer)")


if __name__ == "__main__":
    main()
