"""The Python-client load of bench/kserve.py: N closed-loop callers of MLP Infer for a fixed window,
through tritonclient.grpc.aio (v2 ModelInfer; run by .venv-triton's interpreter, so it imports nothing of
Sluice's) or through Sluice's own asyncio client (Infer; the project's venv). Prints one JSON line.

    .venv-triton/bin/python bench/kserve_client.py triton TARGET CALLERS WARMUP_S DURATION_S
    .venv/bin/python -m bench.kserve_client sluice TARGET CALLERS WARMUP_S DURATION_S
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

FEATURES = 512


async def _triton(target: str) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    import tritonclient.grpc as g
    import tritonclient.grpc.aio as ga

    client = ga.InferenceServerClient(target)
    x = np.random.default_rng(0).standard_normal((1, FEATURES)).astype(np.float32)

    async def call() -> Any:
        tensor = g.InferInput("x", [1, FEATURES], "FP32")
        tensor.set_data_from_numpy(x)
        return (await client.infer("mlp", [tensor])).as_numpy("y")

    return call, client.close


async def _sluice(target: str) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    from clients import AsyncSluiceClient

    client = AsyncSluiceClient(target)
    await client.__aenter__()
    x = np.random.default_rng(0).standard_normal(FEATURES).astype(np.float32)

    async def call() -> Any:
        return (await client.infer("mlp", {"x": x})).outputs["y"]

    async def close() -> None:
        await client.__aexit__(None, None, None)

    return call, close


async def main(kind: str, target: str, callers: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    call, close = await (_triton if kind == "triton" else _sluice)(target)
    await call()  # connected before the window
    start = time.monotonic()
    t0, t1 = start + warmup_s, start + warmup_s + duration_s
    latencies: list[float] = []
    errors = 0

    async def caller() -> None:
        nonlocal errors
        while time.monotonic() < t1:
            began = time.monotonic()
            try:
                await call()
            except Exception:  # a refusal or a transport error: counted, never retried
                errors += 1
                continue
            ended = time.monotonic()
            if t0 <= ended < t1:
                latencies.append((ended - began) * 1000)

    await asyncio.gather(*(caller() for _ in range(callers)))
    await close()
    latencies.sort()

    def pct(q: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(q / 100 * len(latencies)))] if latencies else float("nan")
        )

    return {"ok_per_s": len(latencies) / duration_s, "p50_ms": pct(50), "p99_ms": pct(99), "errors": errors}


if __name__ == "__main__":
    kind, target, callers, warmup, duration = sys.argv[1:6]
    print(
        json.dumps(asyncio.run(main(kind, target, int(callers), float(warmup), float(duration)))), flush=True
    )
