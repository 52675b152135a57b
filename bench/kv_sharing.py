"""bench.kv_cache's `sharing` part (issue 37, acceptance 2): shared prefixes referenced in place against
copied, side by side in one run, on the seeded 8k Llama (the prefix cache on in both).

- shared: streams sharing a 2,000-token system prompt (seen once before, so it is a cached prefix) with
  64-token user turns, 256 new tokens each, in a KV budget of 65,536 tokens: KV held at the peak (the
  server's reserved + shared gauges, sampled), peak sequences running at once, TTFT p50, tokens/s;
- none: as many streams with no prefix in common: tokens/s, to show rows without a prefix pay nothing.

    .venv/bin/python -m bench.kv_cache --part sharing [--quick] [--repeats N]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import grpc
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.generate import percentile, spread
from bench.kv_cache import BYTES_PER_TOKEN, MODEL, Streams, one, server, together
from bench.stack import SluiceServer

SYSTEM, TURN, NEW, BUDGET = 2000, 64, 256, 65536
Row = tuple[float, float, float, float]  # peak held, peak running, TTFT p50, tokens/s


def sharing(directory: Path, repeats: int, quick: bool) -> None:
    streams, new = (8, 64) if quick else (32, NEW)
    rng = random.Random(5)
    system = [rng.randrange(8192) for _ in range(SYSTEM)]
    rows: dict[str, dict[str, list[Row]]] = {"on": {}, "off": {}}
    outputs: dict[str, list[dict[str, list[int]]]] = {"on": [], "off": []}
    for mode in ("on", "off"):
        flags = ("--prefix-sharing", "true" if mode == "on" else "false")
        with server(directory, *flags, "--kv-cache-bytes", str(BUDGET * BYTES_PER_TOKEN)) as s:
            asyncio.run(together(s.target, [[*system, 1]], 4))  # the system prompt has been seen before
            for repeat in range(repeats):
                turn = random.Random(50 + repeat)  # the same prompts in both modes
                shared = [[*system, *(turn.randrange(8192) for _ in range(TURN))] for _ in range(streams)]
                fresh = [[turn.randrange(8192) for _ in range(SYSTEM + TURN)] for _ in range(streams)]
                for row, prompts in (("shared", shared), ("none", fresh)):
                    result, held, running = asyncio.run(_measured(s, prompts, new))
                    ttft = percentile(result.ttft, 50)
                    rows[mode].setdefault(row, []).append((held, running, ttft, result.tokens_per_s))
                    if row == "shared":
                        outputs[mode].append(result.outputs)
    ideal = SYSTEM + streams * (TURN + new)
    print(
        f"\nsharing: {streams} streams, a {SYSTEM}-token system prompt + {TURN}-token turns, {new} tokens "
        f"each, KV budget {BUDGET:,} tokens: --prefix-sharing true (on) against false (off)"
    )
    for row in ("shared", "none"):
        on, off = rows["on"][row], rows["off"][row]
        held, running, ttft, tps = ([[r[i] for r in on], [r[i] for r in off]] for i in range(4))
        print(
            f"  {row:>6}: KV held at peak on {spread(held[0], digits=0)}, off {spread(held[1], digits=0)} "
            f"(on / ({SYSTEM} + {streams} x {TURN + new}) = {statistics.median(held[0]) / ideal:.2f}); "
            f"running at once on {spread(running[0], digits=0)}, off {spread(running[1], digits=0)}; "
            f"TTFT p50 on {spread(ttft[0], 1000)} ms, off {spread(ttft[1], 1000)} ms; tokens/s on "
            f"{spread(tps[0])}, off {spread(tps[1])} "
            f"({statistics.median(tps[0]) / statistics.median(tps[1]):.2f}x)"
        )
    print(f"  outputs the same with sharing on and off: {outputs['on'] == outputs['off']}")


async def _measured(s: SluiceServer, prompts: list[list[int]], new: int) -> tuple[Streams, float, float]:
    """The streams at once, the server's KV gauges sampled meanwhile: (streams, peak held, peak running).
    Held: own regions and the prefixes attended in place (cached here: the system prompt was seen first)."""
    peak = [0.0, 0.0]
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            held = s.metric("sluice_kv_tokens_reserved", model=MODEL)
            held += s.metric("sluice_kv_tokens_shared", model=MODEL)
            peak[0] = max(peak[0], held)
            peak[1] = max(peak[1], s.metric("sluice_kv_slots_in_use", model=MODEL))
            await asyncio.sleep(0.2)  # a sampler, not a wait on a condition

    into = Streams()
    watcher = asyncio.create_task(watch())
    async with grpc.aio.insecure_channel(s.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(one(stub, p, new, into, str(i)) for i, p in enumerate(prompts)))
        into.wall_s = time.perf_counter() - started
    stop.set()
    await watcher
    return into, peak[0], peak[1]
