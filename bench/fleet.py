"""Prefix routing against round-robin (issue 33, acceptance 1): one fleet of replicas, two shims in front of
it (`--routing round_robin` and `--routing prefix`), and multi-turn chat sessions that resend their
conversation each turn through the official `openai` SDK, streamed. Each mode runs its own sessions (other
words, so one mode's cache never serves the other's) on the same replicas, alternating per repeat.

Prints per mode TTFT p50 and p99, the fleet's cached-token share (usage cached_tokens / prompt tokens) and
each replica's share of the calls; then the TTFT p50 ratio (target >= 3x), as medians over repeats with
their spread, and the CPU it ran on.

    .venv/bin/python -m bench.fleet [--replicas 4] [--sessions 64] [--turns 8] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import openai

from bench.stack import STOP_GRACE_S, SluiceServer, SluiceShim
from bench.stats import Spread, percentile

_TEXT = (
    "sluice gate weir lock canal river flow level basin dam spill channel water boat keel pier tide lever "
)
_WORDS = _TEXT.split()


@dataclass(frozen=True, slots=True)
class Turn:
    session: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


async def run_sessions(
    url: str,
    *,
    sessions: int,
    turns: int,
    seed: int,
    model: str = "byte-lm",
    opening_words: int = 60,
    turn_words: int = 6,
    max_tokens: int = 8,
) -> list[Turn]:
    """`sessions` conversations at once, each `turns` turns long: a first message of `opening_words` words
    (its own), then a short user turn after each answer; every turn resends the whole conversation."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    done: list[Turn] = []

    async def session(index: int) -> None:
        rng = random.Random(seed * 100_003 + index)
        messages: list[dict[str, str]] = [
            {"role": "system", "content": f"session {seed}-{index}: " + _words(rng, opening_words)},
        ]
        for turn in range(turns):
            messages.append({"role": "user", "content": _words(rng, turn_words)})
            started = time.perf_counter()
            first: float | None = None
            parts: list[str] = []
            usage = None
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, seed=index,  # type: ignore[arg-type]
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter()
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    usage = chunk.usage
            assert usage is not None, "the stream ended without usage"
            details = usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
            ttft = (first or time.perf_counter()) - started
            done.append(Turn(index, turn, ttft, usage.prompt_tokens, cached))
            messages.append({"role": "assistant", "content": "".join(parts)})

    try:
        await asyncio.gather(*(session(i) for i in range(sessions)))
    finally:
        await client.close()
    return done


def cached_share(turns: Sequence[Turn]) -> float:
    return sum(t.cached_tokens for t in turns) / max(1, sum(t.prompt_tokens for t in turns))


def _admitted(server: SluiceServer) -> float:
    return server.metric("sluice_requests_admitted_total", method="Generate")


def _cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line), "?")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="small", help="byte-lm size (tiny, small, bench)")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--opening-words", type=int, default=150)
    parser.add_argument("--quick", action="store_true", help="2 replicas, 4 sessions, 3 turns, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicas, args.sessions, args.turns, args.repeats, args.opening_words = 2, 4, 3, 1, 40
    flags = ("--models", "byte-lm", "--model-options", f"byte-lm.size={args.size}",
             "--context-length", str(args.context_length),
             "--probe-interval-s", "0.2")  # fmt: skip
    results: dict[str, list[list[Turn]]] = {"round_robin": [], "prefix": []}
    calls: dict[str, list[list[float]]] = {"round_robin": [], "prefix": []}
    with ExitStack() as stack:
        servers = []
        for _ in range(args.replicas):
            server = SluiceServer(*flags)
            stack.callback(server.stop, STOP_GRACE_S)
            servers.append(server)
        target = ",".join(s.target for s in servers)
        shims = {}
        for mode in results:
            shim = SluiceShim(target, "--routing", mode, "--routing-probe-s", "0.2")
            stack.callback(shim.stop, STOP_GRACE_S)
            shims[mode] = shim
        for repeat in range(args.repeats):
            for mode, shim in shims.items():
                before = [_admitted(s) for s in servers]
                seed = repeat * 2 + (mode == "prefix")
                turns = asyncio.run(
                    run_sessions(
                        shim.url, sessions=args.sessions, turns=args.turns,
                        seed=seed, opening_words=args.opening_words,
                    )
                )  # fmt: skip
                results[mode].append(turns)
                calls[mode].append([_admitted(s) - b for s, b in zip(servers, before, strict=True)])
    print(
        f"bench.fleet: {args.replicas} replicas of byte-lm ({args.size}, context {args.context_length}), "
        f"{args.sessions} sessions x {args.turns} turns, {args.repeats} repeats; CPU: {_cpu()}"
    )
    p50: dict[str, list[float]] = {}
    for mode, runs in results.items():
        p50[mode] = [percentile([t.ttft_s for t in run], 50) * 1000 for run in runs]
        p99 = [percentile([t.ttft_s for t in run], 99) * 1000 for run in runs]
        shares = [cached_share(run) for run in runs]
        spread = ["/".join(f"{c / max(1.0, sum(counts)):.2f}" for c in counts) for counts in calls[mode]]
        print(
            f"  {mode:12} TTFT p50 {Spread.of(p50[mode]).format(1)} ms, p99 {Spread.of(p99).format(1)} ms, "
            f"cached share {Spread.of(shares).format(3)}, calls per replica {' '.join(spread)}"
        )
    ratios = [rr / px for rr, px in zip(p50["round_robin"], p50["prefix"], strict=True)]
    print(f"  TTFT p50 round_robin / prefix: {Spread.of(ratios).format(2)}x (target >= 3x)")


if __name__ == "__main__":
    main()
