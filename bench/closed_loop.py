"""The load-generator process: N closed-loop callers against one endpoint, measured in a fixed window.

    python -m bench.closed_loop --protocol grpc --target 127.0.0.1:PORT --callers 64

Protocols: grpc (grpc.aio, raw bytes), httpx (httpx.AsyncClient), http (HTTP/1.1 on asyncio streams).

It connects, prints `ready`, then reads `START <t0> <t1>` (epoch seconds) on stdin: callers run from
then on (warm-up), calls completing inside [t0, t1] are recorded, no call starts after t1, and one
`RESULT {json}` line is printed. Every caller is bounded by --max-calls and by t1 + --drain-s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from bench.callers import Endpoint, Outcome, batch_timings, grpc_infer, http_infer, raw_http_infer


@dataclass(slots=True)
class WindowRecord:
    """What one client process saw inside the measurement window."""

    ok_ms: list[float] = field(default_factory=list)
    refused_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    batches: list[tuple[int, float, float]] = field(default_factory=list)  # sampled server timings
    started: int = 0  # calls started over the whole run, warm-up included
    unfinished: int = 0  # callers still waiting at t1 + drain (cancelled)


async def _caller(
    endpoint: Endpoint,
    record: WindowRecord,
    bodies: list[bytes],
    *,
    t0: float,
    t1: float,
    args: argparse.Namespace,
) -> None:
    for _ in range(args.max_calls):
        if time.time() >= t1:
            return
        keep = time.time() >= t0 and record.started % args.sample_every == 0
        record.started += 1
        start = time.perf_counter()
        result = await endpoint.call(keep)
        elapsed_ms = round((time.perf_counter() - start) * 1000, 3)
        if not t0 <= time.time() <= t1:
            continue
        if result.outcome is Outcome.OK:
            record.ok_ms.append(elapsed_ms)
            if result.body:
                bodies.append(result.body)
        elif result.outcome is Outcome.REFUSED:
            record.refused_ms.append(elapsed_ms)
        else:
            record.errors[result.detail] += 1


async def run(args: argparse.Namespace) -> WindowRecord:
    if args.protocol == "grpc":
        endpoint = grpc_infer(args.target, timeout_s=args.timeout_s)
    elif args.protocol == "httpx":
        endpoint = http_infer(
            f"http://{args.target}", timeout_s=args.timeout_s, connections=args.callers, api=args.http_api
        )
    else:
        host, port = args.target.rsplit(":", 1)
        endpoint = raw_http_infer(host, int(port), timeout_s=args.timeout_s, api=args.http_api)
    record = WindowRecord()
    bodies: list[bytes] = []
    try:
        await endpoint.ready()
        print("ready", flush=True)
        line = await asyncio.wait_for(asyncio.to_thread(sys.stdin.readline), args.start_timeout_s)
        verb, t0_text, t1_text = line.split()
        if verb != "START":
            raise ValueError(f"expected 'START t0 t1' on stdin, got {line!r}")
        t0, t1 = float(t0_text), float(t1_text)
        callers = [
            asyncio.create_task(_caller(endpoint, record, bodies, t0=t0, t1=t1, args=args))
            for _ in range(args.callers)
        ]
        _, pending = await asyncio.wait(callers, timeout=max(t1 - time.time(), 0.0) + args.drain_s)
        record.unfinished = len(pending)
        for task in pending:
            task.cancel()
        for task in callers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await endpoint.close()
    if args.protocol == "grpc":
        record.batches = batch_timings(bodies)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.closed_loop", description=__doc__)
    parser.add_argument("--protocol", choices=("grpc", "httpx", "http"), required=True)
    parser.add_argument("--target", required=True, help="HOST:PORT (loopback)")
    parser.add_argument("--http-api", choices=("naive", "sluice"), default="naive", help="for http/httpx")
    parser.add_argument("--callers", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, default=10.0, help="per-call deadline")
    parser.add_argument("--max-calls", type=int, default=200_000, help="per caller")
    parser.add_argument("--drain-s", type=float, default=15.0)
    parser.add_argument("--start-timeout-s", type=float, default=120.0)
    parser.add_argument("--sample-every", type=int, default=16, help="decode every Nth answer's timings")
    args = parser.parse_args(argv)
    if not args.target.startswith(("127.0.0.1:", "localhost:", "[::1]:")):
        raise ValueError(f"--target must be a loopback address, got {args.target}")
    record = asyncio.run(run(args))
    print("RESULT " + json.dumps(asdict(record)), flush=True)


if __name__ == "__main__":
    main()
