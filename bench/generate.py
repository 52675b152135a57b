"""Generate throughput: aggregate tokens/s at 1, 8 and 32 concurrent gRPC streams through Sluice, against
the raw batched decode loop in-process (the limit) and against serving the same streams one after another;
time to first token and inter-token latency per concurrency. Medians of repeats with their range.

    .venv/bin/python -m bench.generate [--quick] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

import grpc
import torch
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench import plot
from bench.stack import running
from server.runtimes.byte_lm import ByteLm

MODEL = "byte-lm"
PROMPT = "The quick brown fox jumps over"  # 30 byte tokens
CONCURRENCY = (1, 8, 32)


@dataclass
class Run:
    """One measured window: tokens over wall time, and the latency samples of its streams (seconds)."""

    tokens: int
    wall_s: float
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def spread(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"


# -- the limit: the bare decode loop ------------------------------------------------------------------
def raw_decode(batch: int, tokens: int, *, context_length: int) -> Run:
    """Prefill `batch` copies of PROMPT, then `tokens` batched decode steps with argmax, in-process."""
    model = ByteLm(
        size="bench", context_length=context_length, max_sequences=batch, device=torch.device("cpu")
    )
    model.allocate_cache(batch * context_length)
    prompt = list(PROMPT.encode())
    with torch.inference_mode():
        started = time.perf_counter()
        slots = [row * context_length for row in range(batch)]  # each stream's region of the arena
        logits = torch.stack([model.prefill(slot, prompt) for slot in slots])
        positions = torch.full((batch,), len(prompt))
        for _ in range(tokens - 1):
            next_tokens = logits.argmax(dim=-1)
            logits = model.decode(slots, next_tokens, positions)
            positions += 1
        logits.argmax(dim=-1).tolist()
        wall = time.perf_counter() - started
    return Run(tokens=batch * tokens, wall_s=wall)


def step_ms(batch: int, *, context_length: int, steps: int = 30) -> float:
    """Median milliseconds of one batched decode step at about position 100."""
    model = ByteLm(
        size="bench", context_length=context_length, max_sequences=batch, device=torch.device("cpu")
    )
    model.allocate_cache(batch * context_length)
    times = []
    with torch.inference_mode():
        tokens, positions = torch.full((batch,), 65), torch.full((batch,), 100)
        bases = [row * context_length for row in range(batch)]
        for _ in range(steps):
            started = time.perf_counter()
            model.decode(bases, tokens, positions).argmax(dim=-1).tolist()
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


# -- through Sluice -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """What each stream asks for: a model, a prompt and sampling (seeded per stream)."""

    model: str = MODEL
    prompt: str = PROMPT
    temperature: float = 1.0
    ignore_eos: bool = False


async def stream(
    stub: pb_grpc.InferenceServiceStub, seed: int, tokens: int, run: Run, load: Load = Load()
) -> None:
    request = pb.GenerateRequest(
        model=load.model,
        text=load.prompt,
        sampling=pb.SamplingParams(
            max_tokens=tokens, seed=seed, temperature=load.temperature, ignore_eos=load.ignore_eos
        ),
    )
    started = last = time.perf_counter()
    first = True
    call = stub.Generate(request, timeout=300)
    async for message in call:
        now = time.perf_counter()
        count = len(message.token_ids)
        if not count:
            continue
        if first:
            first = False
            run.ttft.append(now - started)
        else:
            run.itl.append(now - last)
        # Tokens coalesced into one message arrived together: the gap belongs to the first of them.
        run.itl.extend([0.0] * (count - 1))
        last = now
        run.tokens += count


async def concurrent(
    target: str, streams: int, tokens: int, *, sequential: bool = False, load: Load = Load()
) -> Run:
    run = Run(tokens=0, wall_s=0.0)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        if sequential:
            for i in range(streams):
                await stream(stub, i, tokens, run, load)
        else:
            await asyncio.gather(*(stream(stub, i, tokens, run, load) for i in range(streams)))
        run.wall_s = time.perf_counter() - started
    return run


def print_latency(runs_by_streams: dict[int, list[Run]]) -> None:
    """TTFT and inter-token latency per concurrency: medians and range of the repeats' percentiles."""
    print("\nlatency through Sluice, ms: median [min-max] of the repeats' percentiles")
    print(f"{'streams':>7} {'TTFT p50':>16} {'TTFT p99':>16} {'ITL p50':>14} {'ITL p99':>14}")
    for b, runs in runs_by_streams.items():
        cells = [
            spread([percentile(x.ttft, 50) for x in runs], 1000, 1),
            spread([percentile(x.ttft, 99) for x in runs], 1000, 1),
            spread([percentile(x.itl, 50) for x in runs], 1000, 1),
            spread([percentile(x.itl, 99) for x in runs], 1000, 1),
        ]
        print(f"{b:>7} {cells[0]:>16} {cells[1]:>16} {cells[2]:>14} {cells[3]:>14}")


def draw_streams(name: str, title: str, tokens_per_s: dict[str, dict[int, list[Run]]], sluice: str) -> None:
    """The PNG beside the tables: every side's tokens/s, and side `sluice`'s TTFT p50/p99, by streams."""
    throughput = {
        side: {b: [r.tokens_per_s for r in runs] for b, runs in by.items()}
        for side, by in tokens_per_s.items()
    }
    runs = tokens_per_s[sluice]
    ttft = {
        f"{sluice} p{q}": {b: [percentile(r.ttft, q) * 1000 for r in rs] for b, rs in runs.items()}
        for q in (50, 99)
    }
    plot.draw(
        name,
        [
            plot.Panel("aggregate tokens/s", "tokens/s", throughput),
            plot.Panel("time to first token", "ms", ttft),
        ],
        x_label="concurrent streams",
        title=title,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, shorter streams")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    parser.add_argument("--torch-threads", type=int, default=2, help="intra-op threads, server and raw loop")
    args = parser.parse_args()
    repeats, tokens = (1, 64) if args.quick else (args.repeats, args.tokens)
    context = 512
    torch.set_num_threads(args.torch_threads)

    print(
        f"bench model: byte-lm size=bench, torch threads {args.torch_threads} (server and raw loop), "
        f"{tokens} tokens per stream after a {len(PROMPT)}-token prompt, {repeats} repeat(s)"
    )
    for b in CONCURRENCY:
        print(
            f"  raw decode step at batch {b:>2}: {step_ms(b, context_length=context):.1f} ms (median of 30)"
        )

    flags = [
        "--models",
        MODEL,
        "--model-options",
        "byte-lm.size=bench",
        "--torch-threads",
        str(args.torch_threads),
        "--max-sequences",
        "32",
        "--max-queue",
        "64",
        "--context-length",
        str(context),
    ]
    raw: dict[int, list[Run]] = {b: [] for b in CONCURRENCY}
    sluice: dict[int, list[Run]] = {b: [] for b in CONCURRENCY}
    sequential: list[Run] = []
    with running(*flags) as (server, _shim):
        asyncio.run(concurrent(server.target, 4, 16))  # warm the paths
        # Each raw run sits next to its Sluice run, so that load from other tenants hits both alike.
        for _ in range(repeats):
            for b in CONCURRENCY:
                raw[b].append(raw_decode(b, tokens, context_length=context))
                sluice[b].append(asyncio.run(concurrent(server.target, b, tokens)))
            sequential.append(asyncio.run(concurrent(server.target, 8, tokens, sequential=True)))

    print("\naggregate tokens/s, median [min-max] of repeats")
    print(f"{'streams':>7} {'raw loop':>18} {'sluice gRPC':>18} {'sluice/raw':>16} {'sluice/sequential':>18}")
    seq = [r.tokens_per_s for r in sequential]
    for b in CONCURRENCY:
        r = [x.tokens_per_s for x in raw[b]]
        s = [x.tokens_per_s for x in sluice[b]]
        vs_raw = [a / c for a, c in zip(s, r, strict=True)]
        vs_seq = [a / c for a, c in zip(s, seq, strict=True)]
        print(
            f"{b:>7} {spread(r):>18} {spread(s):>18} {spread(vs_raw, digits=2):>16} "
            f"{spread(vs_seq, digits=2):>18}"
        )
    print(f"{'seq x8':>7} {'':>18} {spread(seq):>18}   (8 streams served one after another through Sluice)")

    print_latency(sluice)
    draw_streams(
        "generate",
        "bench.generate: byte-lm, Sluice against the raw batched decode loop",
        {"raw decode loop": raw, "sluice gRPC": sluice, "sequential x8 (sluice)": {8: sequential}},
        "sluice gRPC",
    )
    # The median of each repeat's pair, as the table prints it (a ratio of medians mixes repeats).
    pairs = zip(sluice[32], raw[32], strict=True)
    at32 = statistics.median(a.tokens_per_s / c.tokens_per_s for a, c in pairs)
    print(
        f"\ntarget: sluice >= 0.8 x raw loop at 32 streams: {at32:.2f} "
        f"-> {'met' if at32 >= 0.8 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
