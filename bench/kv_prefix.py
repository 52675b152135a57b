"""bench.kv_cache's `prefix` part (issue 19): 32 streams sharing a 2,000-token system prompt with a short
user turn each, multi-turn chats that resend the conversation, and 32 streams with no prefix in common, on
the seeded 8k Llama: TTFT p50 and tokens/s, --prefix-cache true against false, in one run.

    .venv/bin/python -m bench.kv_cache --part prefix [--prefix-rows shared chat none] [--quick] [--repeats N]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import grpc
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench import plot
from bench.generate import percentile, spread
from bench.kv_cache import BYTES_PER_TOKEN, Streams, one, server, together

ROWS = ("shared", "chat", "none")


def prefix(directory: Path, repeats: int, quick: bool, rows: tuple[str, ...] = ROWS) -> None:
    streams, system, tokens = (8 if quick else 32), 2000, 32
    rng = random.Random(1)
    shared = [rng.randrange(8192) for _ in range(system)]
    turns = [shared + [rng.randrange(8192) for _ in range(20)] for _ in range(streams)]
    results: dict[str, dict[str, list[Streams]]] = {"on": {}, "off": {}}
    for mode in ("on", "off"):
        flag = "true" if mode == "on" else "false"
        with server(
            directory, "--prefix-cache", flag, "--kv-cache-bytes", str(256 * 1024 * BYTES_PER_TOKEN)
        ) as s:
            asyncio.run(together(s.target, [[*shared, 1]], 4))  # the system prompt has been seen before
            for repeat in range(repeats):
                if "shared" in rows:
                    shared_run = asyncio.run(together(s.target, turns, tokens))
                    results[mode].setdefault("shared", []).append(shared_run)
                if "chat" in rows:
                    results[mode].setdefault("chat", []).append(asyncio.run(chats(s.target, repeat, quick)))
                if "none" in rows:
                    fresh = random.Random(100 + repeat)  # new prompts each repeat (the same in both modes)
                    distinct = [[fresh.randrange(8192) for _ in range(200)] for _ in range(streams)]
                    none_run = asyncio.run(together(s.target, distinct, tokens))
                    results[mode].setdefault("none", []).append(none_run)
    print(
        f"\nprefix cache: {streams} streams, a {system}-token system prompt + 20 tokens, {tokens} tokens each"
    )
    named = {"shared": "shared system prompt", "chat": "multi-turn chats", "none": "no shared prefix"}
    for part, what in ((row, named[row]) for row in rows):
        on, off = results["on"][part], results["off"][part]
        ttft_on = [percentile(r.ttft, 50) for r in on]
        ttft_off = [percentile(r.ttft, 50) for r in off]
        tps_on, tps_off = [r.tokens_per_s for r in on], [r.tokens_per_s for r in off]
        print(
            f"  {what:>22}: TTFT p50 on {spread(ttft_on, 1000)} ms, off {spread(ttft_off, 1000)} ms "
            f"({statistics.median(ttft_off) / statistics.median(ttft_on):.1f}x lower); tokens/s on "
            f"{spread(tps_on)}, off {spread(tps_off)} "
            f"({statistics.median(tps_on) / statistics.median(tps_off):.2f}x)"
        )
        if part != "none":
            assert all(a.outputs == b.outputs for a, b in zip(on, off, strict=True)), "outputs differ"
    series = {
        measure: {
            f"{named[part]}, cache {mode}": {streams: [get(r) for r in results[mode][part]]}
            for part in rows
            for mode in ("on", "off")
        }
        for measure, get in (
            ("ttft", lambda r: percentile(r.ttft, 50) * 1000),
            ("tps", lambda r: r.tokens_per_s),
        )
    }
    plot.draw(
        "kv_cache_prefix",
        [
            plot.Panel("TTFT p50", "ms", series["ttft"]),
            plot.Panel("aggregate tokens/s", "tokens/s", series["tps"]),
        ],
        x_label="concurrent streams",
        title="bench.kv_cache: the prefix cache on against off",
    )


async def chats(target: str, seed: int, quick: bool) -> Streams:
    """8 conversations of 4 turns, each turn resending the conversation so far plus 60 new tokens."""
    into = Streams()
    conversations = 4 if quick else 8

    async def chat(stub: pb_grpc.InferenceServiceStub, index: int) -> None:
        rng = random.Random(seed * 1000 + index)  # its own: the same conversation whatever runs beside it
        history = [rng.randrange(8192) for _ in range(300)]
        for turn in range(4):
            await one(stub, history, 24, into, f"{index}.{turn}")
            history = history + into.outputs[f"{index}.{turn}"] + [rng.randrange(8192) for _ in range(60)]

    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(chat(stub, i) for i in range(conversations)))
        into.wall_s = time.perf_counter() - started
    return into
