"""Tenant isolation: a steady tenant's Infer latency alone and while another tenant floods at 10x its
share with HIGH priority, side by side with the same flood against a server without tenants (one shared
gate). Medians over repeats with their range; the flooder's admitted and refused calls.

    .venv/bin/python -m bench.tenants [--quick]

The steady tenant's callers run in a process of their own, the flood's in this one (grpc.aio); a refused
flooder calls again after the server's retry delay, as the SDKs do. The server runs the MLP with 8 slots.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import grpc
import numpy as np
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench import plot
from bench.generate import percentile, spread
from bench.stack import running
from clients.errors import error_from_rpc

SLOTS = 8
STEADY, FLOOD = "steady-token", "flood-token"
STEADY_CALLERS = 2
FLOOD_SHARE = 0.25  # 2 of the 8 slots; the flood runs 10x that many callers
KEYS = f"""
[[tenant]]
name = "steady"
token_sha256 = "{hashlib.sha256(STEADY.encode()).hexdigest()}"
share = 0.5

[[tenant]]
name = "flood"
token_sha256 = "{hashlib.sha256(FLOOD.encode()).hexdigest()}"
priority_ceiling = "normal"
share = {FLOOD_SHARE}
"""


def request(priority: int) -> pb.InferRequest:
    x = np.ones(512, np.float32)
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    return pb.InferRequest(model="mlp", inputs=[tensor], priority=priority)


async def callers(
    target: str, token: str | None, count: int, priority: int, until: float, latencies: list[float]
) -> tuple[int, int]:
    """`count` closed-loop callers until `until`; returns (ok, refused)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    ok = refused = 0
    message = request(priority)

    async def one(stub: pb_grpc.InferenceServiceStub) -> None:
        nonlocal ok, refused
        while time.perf_counter() < until:
            started = time.perf_counter()
            try:
                await stub.Infer(message, timeout=10, metadata=metadata)
                ok += 1
                latencies.append(time.perf_counter() - started)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refused += 1
                # As the SDKs do: again after the server's retry delay (RetryInfo), or at once.
                await asyncio.sleep(error_from_rpc(exc).retry_after or 0.0)

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        await asyncio.gather(*(one(stub) for _ in range(count)))
    return ok, refused


def _steady(target: str, tenants: bool, seconds: float) -> float:
    """The steady callers' p99 (ms), in a process of their own: the flood's client work is not theirs."""
    latencies: list[float] = []
    until = time.perf_counter() + seconds
    asyncio.run(callers(target, STEADY if tenants else None, STEADY_CALLERS, 1, until, latencies))
    return 1000 * percentile(latencies, 99)


def window(target: str, tenants: bool, flooders: int, seconds: float) -> tuple[float, int, int]:
    """The steady callers' p99 (ms) over `seconds` beside `flooders` HIGH-priority callers of the other
    tenant (none: alone); and the flood's counts."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        steady = pool.submit(_steady, target, tenants, seconds)
        flood_ok = flood_refused = 0
        if flooders:
            until = time.perf_counter() + seconds
            flood_ok, flood_refused = asyncio.run(
                callers(target, FLOOD if tenants else None, flooders, 2, until, [])
            )
        return steady.result(), flood_ok, flood_refused


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--max-delay-ms", default="0", help="the server's --max-delay-ms (default: its own)")
    args = parser.parse_args()
    repeats, seconds = (1, 2.0) if args.quick else (args.repeats, args.seconds)
    share_callers, flooders = int(FLOOD_SHARE * SLOTS), int(10 * FLOOD_SHARE * SLOTS)
    rows: dict[str, list[tuple[float, float, float, int, int]]] = {"tenants": [], "one shared gate": []}
    with tempfile.TemporaryDirectory() as scratch:
        keys = Path(scratch) / "keys.toml"
        keys.write_text(KEYS)
        for label, extra in (("tenants", ["--auth-keys", str(keys)]), ("one shared gate", [])):
            flags = ["--models", "mlp", "--max-concurrency", str(SLOTS), "--max-queue", "256",
                     "--max-delay-ms", args.max_delay_ms, *extra]  # fmt: skip
            with running(*flags) as (server, _shim):
                tenants = bool(extra)
                window(server.target, tenants, 0, 1.0)  # warm
                for _ in range(repeats):
                    alone, _, _ = window(server.target, tenants, 0, seconds)
                    # The other tenant using its share and no more: what the flood may cost at best.
                    at_share, _, _ = window(server.target, tenants, share_callers, seconds)
                    loaded, ok, refused = window(server.target, tenants, flooders, seconds)
                    rows[label].append((alone, at_share, loaded, ok, refused))
    print(
        f"steady tenant: {STEADY_CALLERS} callers; flood: {flooders} callers at HIGH priority, 10x its "
        f"share ({FLOOD_SHARE} of {SLOTS} slots, {share_callers} callers); --max-delay-ms "
        f"{args.max_delay_ms}; {repeats} repeat(s) of {seconds:g} s; p99 in ms"
    )
    print(f"{'server':>16} {'steady alone':>18} {'other at share':>18} {'with the flood':>18} "
          f"{'flood/alone':>16} {'flood ok/s':>11} {'refused/s':>10}")  # fmt: skip
    for label, runs in rows.items():
        columns = " ".join(f"{spread([r[k] for r in runs], digits=2):>18}" for k in range(3))
        ratios = spread([r[2] / r[0] for r in runs], digits=2)
        print(
            f"{label:>16} {columns} {ratios:>16} {statistics.median(r[3] for r in runs) / seconds:>11.0f} "
            f"{statistics.median(r[4] for r in runs) / seconds:>10.0f}"
        )
    loads = (0, share_callers, flooders)
    plot.draw(
        "tenants",
        [
            plot.Panel(
                "the steady tenant's p99",
                "ms",
                {
                    label: {max(x, 1): [r[k] for r in runs] for k, x in enumerate(loads)}
                    for label, runs in rows.items()
                },
            ),
        ],  # the steady tenant alone sits at 1 on the log axis
        x_label="the other tenant's callers (1: none)",
        title="bench.tenants: a steady tenant beside another flooding at HIGH priority",
    )
    ratio = statistics.median(r[2] / r[0] for r in rows["tenants"])
    share = statistics.median(r[1] / r[0] for r in rows["tenants"])
    verdict = "met" if ratio <= 1.5 else "MISSED"
    print(f"\ntarget: steady p99 with the flood <= 1.5x alone: {ratio:.2f} -> {verdict} "
          f"(the other tenant at its share alone: {share:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
