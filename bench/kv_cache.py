"""KV memory by the token (issue 19), on a seeded Llama with an 8k context (bench.hf_generate's model with
max_position_embeddings 8192), each part beside the same load with the feature off, in one run:

- capacity: a fixed KV budget and prompts log-normally spread over 50-4,000 tokens with max_tokens over
  16-512: sequences held at once by Sluice's allocator (KvMemory, the server's own, under churn) against
  the budget held exactly (sum of each sequence's prompt + max_tokens) and against the slot cache of the
  last engine (budget / 8,192 tokens per slot); then the real server at a smaller budget, its peak of
  sequences running at once;
- prefix cache: 32 streams sharing a 2,000-token system prompt with a short user turn each, multi-turn
  chats that resend the conversation, and 32 streams with no prefix in common: TTFT p50 and tokens/s,
  --prefix-cache true against false (bench/kv_prefix.py);
- preemption: LOW streams fill the memory, then HIGH calls arrive: every HIGH served, their TTFT p99 against
  a HIGH call's TTFT on an idle server; the LOW streams' output against the same prompts run alone;
- sharing (issue 37): shared prefixes referenced in place against copied, on the Llama and on SmolLM2
  (bench/kv_sharing.py);
- growth (issue 37): outputs held as written against reserved up front, SmolLM2 on a chat mix that ends at
  EOS (bench/kv_growth.py).

    .venv/bin/python -m bench.kv_cache [--quick] [--repeats N]
        [--part capacity|prefix|preemption|sharing|growth] [--model llama|smollm2 (of sharing)]
        [--sharing-rows served|counted|all] [--growth-chats N]
        [--growth-contexts N (the KV budget, in contexts)]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.generate import percentile, spread
from bench.hf_generate import CONFIG
from bench.stack import SluiceServer
from server.batching.memory import KvMemory
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import SamplingParams
from server.metrics import Metrics

MODEL = "llama"
CONTEXT = 8192
LLAMA_8K: dict[str, Any] = {**CONFIG, "max_position_embeddings": CONTEXT}
BYTES_PER_TOKEN = 2 * CONFIG["num_hidden_layers"] * CONFIG["num_key_value_heads"] * 64 * 4  # float32


def build(directory: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_8K)).eval().save_pretrained(directory)
    return directory


def request_mix(count: int, seed: int) -> list[tuple[int, int]]:
    """(prompt tokens, max_tokens): prompts log-normal within 50-4,000 (median ~600), max_tokens 16-512."""
    rng = random.Random(seed)
    mix = []
    for _ in range(count):
        prompt = int(min(4000, max(50, rng.lognormvariate(6.4, 0.9))))
        mix.append((prompt, int(min(512, max(16, rng.lognormvariate(4.8, 0.9))))))
    return mix


# -- capacity ---------------------------------------------------------------------------------------------
def allocator_capacity(budget_tokens: int, seed: int, events: int = 400) -> tuple[list[int], list[float]]:
    """Admits the mix into KvMemory until it refuses, then lets a random running sequence finish and goes
    on: at each refusal, the sequences held and their exact needs as a fraction of the budget."""
    memory = KvMemory(budget_tokens, prefix_cache=False, metrics=Metrics(), model="bench")
    rng = random.Random(seed)
    mix = iter(request_mix(100_000, seed))
    held: list[tuple[GenSequence, int]] = []
    counts, fill = [], []
    pending: tuple[int, int] | None = None
    while len(counts) < events:
        prompt, max_tokens = pending or next(mix)
        ids = [rng.randrange(8192) for _ in range(prompt)]
        seq = GenSequence(
            ids, SamplingParams(max_tokens=max_tokens), 0, TokenStream(2, lambda: None), TextAssembler(()),
            0.0, feed=ids,
        )  # fmt: skip
        if memory.admit(seq, lambda victim: None):
            held.append((seq, prompt + max_tokens))
            pending = None
            continue
        pending = (prompt, max_tokens)
        counts.append(len(held))
        fill.append(sum(need for _, need in held) / budget_tokens)
        for _ in range(max(1, len(held) // 8)):  # an eighth of them finish, in random order
            seq, _ = held.pop(rng.randrange(len(held)))
            memory.release(seq)
    return counts, fill


@dataclass
class Streams:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    outputs: dict[str, list[int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


async def one(
    stub: pb_grpc.InferenceServiceStub, ids: list[int], tokens: int, into: Streams, key: str = "",
    priority: int = 0,
) -> None:  # fmt: skip
    request = pb.GenerateRequest(
        model=MODEL, token_ids=pb.TokenIds(ids=ids), priority=priority,  # type: ignore[arg-type]
        sampling=pb.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
    )  # fmt: skip
    started, got = time.perf_counter(), []
    async for message in stub.Generate(request, timeout=900):
        if message.token_ids and not got:
            into.ttft.append(time.perf_counter() - started)
        got.extend(message.token_ids)
    into.tokens += len(got)
    into.outputs[key] = got


async def together(target: str, prompts: list[list[int]], tokens: int, priority: int = 0) -> Streams:
    into = Streams()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(one(stub, p, tokens, into, str(i), priority) for i, p in enumerate(prompts)))
        into.wall_s = time.perf_counter() - started
    return into


def server(directory: Path, *flags: str) -> SluiceServer:
    return SluiceServer(
        "--hf-models", f"{MODEL}={directory}", "--torch-threads", "1", "--dtype", "float32",
        "--context-length", str(CONTEXT), "--max-queue", "256", *flags,
    )  # fmt: skip


def capacity(directory: Path, repeats: int, quick: bool) -> None:
    budget = 16 * CONTEXT  # the last engine's cache at this budget: 16 slots of 8,192 tokens
    print(
        f"\ncapacity: KV budget {budget:,} tokens ({budget * BYTES_PER_TOKEN / 2**20:.0f} MiB of this model)"
    )
    slots = budget // CONTEXT
    for seed in range(repeats):
        counts, fill = allocator_capacity(budget, seed, 100 if quick else 400)
        print(
            f"  mix {seed}: sequences held at refusal {spread(counts)} (median [min-max] of {len(counts)}); "
            f"exact needs / budget {spread(fill, digits=3)}; vs {slots} slots: "
            f"{statistics.median(counts) / slots:.1f}x"
        )
    small = 4 * CONTEXT
    mix = request_mix(40, 7)
    rng = random.Random(7)
    prompts = [[rng.randrange(8192) for _ in range(p)] for p, _ in mix]
    s = server(directory, "--kv-cache-bytes", str(small * BYTES_PER_TOKEN))
    with s:
        peak = [0.0, 0.0]

        async def watch(stop: asyncio.Event) -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], s.metric("sluice_kv_slots_in_use", model=MODEL))
                peak[1] = max(peak[1], s.metric("sluice_kv_tokens_reserved", model=MODEL))
                await asyncio.sleep(0.2)  # a sampler, not a wait on a condition

        async def run() -> None:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(stop))
            async with grpc.aio.insecure_channel(s.target) as channel:
                stub = pb_grpc.InferenceServiceStub(channel)
                into = Streams()
                await asyncio.gather(*(one(stub, p, n, into) for p, (_, n) in zip(prompts, mix, strict=True)))
            stop.set()
            await watcher

        asyncio.run(run())
    held_exactly = _exact_fit(mix, small)
    print(
        f"  the server, budget {small:,} tokens, the first 40 of mix 7: peak sequences running at once "
        f"{peak[0]:.0f} (reserving {peak[1] / small:.2f} of the budget at most); held exactly, in arrival "
        f"order: {held_exactly}; slot cache: {small // CONTEXT}"
    )


def _exact_fit(mix: list[tuple[int, int]], budget: int) -> int:
    used = count = 0
    for prompt, max_tokens in mix:
        if used + prompt + max_tokens > budget:
            break
        used, count = used + prompt + max_tokens, count + 1
    return count


# -- preemption -------------------------------------------------------------------------------------------
def preemption(directory: Path, repeats: int, quick: bool) -> None:
    low_n, high_n, tokens = (8, 4, 48) if quick else (16, 8, 96)
    rng = random.Random(3)
    lows = [[rng.randrange(8192) for _ in range(200)] for _ in range(low_n)]
    highs = [[rng.randrange(8192) for _ in range(100)] for _ in range(high_n)]
    budget = (low_n // 2) * (208 + tokens + 16)  # holds half the LOW streams
    flags = ("--kv-cache-bytes", str(budget * BYTES_PER_TOKEN), "--context-length", str(budget))
    s = server(directory, *flags)
    with s:
        # The same HIGH burst on the idle server: what its TTFT is without LOW streams holding the memory.
        idle = [
            percentile(asyncio.run(together(s.target, highs, tokens, priority=3)).ttft, 99) for _ in range(3)
        ]
        alone = asyncio.run(together(s.target, lows, tokens, priority=1)).outputs  # waits, never preempted
        p99s, served, correct = [], [], []
        before = s.metric("sluice_preemptions_total", model=MODEL)
        for _ in range(repeats):

            async def mixed() -> tuple[Streams, Streams]:
                low_task = asyncio.create_task(together(s.target, lows, tokens, priority=1))
                while s.metric("sluice_kv_slots_in_use", model=MODEL) < low_n // 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # polls the server's gauge: a metric, not a local event
                high = await together(s.target, highs, tokens, priority=3)
                return await low_task, high

            low, high = asyncio.run(mixed())
            p99s.append(percentile(high.ttft, 99))
            served.append(len(high.outputs) == high_n)
            correct.append(low.outputs == alone)
        preempted = s.metric("sluice_preemptions_total", model=MODEL) - before
        recomputed = s.metric("sluice_recomputed_tokens_total", model=MODEL)
    idle_ttft = statistics.median(idle)
    print(
        f"\npreemption: {low_n} LOW streams of 200 + {tokens} tokens in a budget of {budget} tokens (half "
        f"of them), then {high_n} HIGH calls at once: TTFT p99 {spread(p99s, 1000)} ms vs the burst on an "
        f"idle server {idle_ttft * 1000:.0f} ms = {statistics.median(p99s) / idle_ttft:.2f}x (target < 3x); "
        f"every HIGH served: {all(served)}; LOW output as run alone: {all(correct)}; "
        f"{preempted:.0f} preemptions, {recomputed:.0f} tokens "
        "recomputed"
    )


PARTS = ("capacity", "prefix", "preemption", "sharing", "growth")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer streams")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--part", choices=PARTS, action="append")
    parser.add_argument(
        "--prefix-rows",
        nargs="+",
        choices=("shared", "chat", "none"),
        default=["shared", "chat", "none"],
        help="of --part prefix",
    )
    parser.add_argument(
        "--model", choices=("llama", "smollm2"), action="append", help="of --part sharing (default: both)"
    )
    parser.add_argument(
        "--sharing-rows",
        choices=("served", "counted", "all"),
        default="all",
        help="of --part sharing: served, the real server's rows only (KV held, tokens/s); counted, the "
        "in-process count alone (running at once in the budget)",
    )
    parser.add_argument("--growth-chats", type=int, default=0, help="of --part growth (0: its default)")
    parser.add_argument(
        "--growth-contexts",
        type=int,
        default=0,
        help="of --part growth: the KV budget in contexts (0: default)",
    )
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    parts = args.part or list(PARTS)
    from bench.smollm2 import cpu

    print(f"{cpu()}; seeded Llama, 8k context ({LLAMA_8K}), float32, torch threads 1, {repeats} repeat(s)")
    with tempfile.TemporaryDirectory(prefix="sluice-bench-kv-") as scratch:
        directory = build(Path(scratch))
        for part in parts:
            if part == "prefix":
                from bench.kv_prefix import prefix  # it imports this module's pieces

                prefix(directory, repeats, args.quick, tuple(args.prefix_rows))
            elif part == "sharing":
                from bench import kv_models, kv_sharing

                size = kv_sharing.QUICK if args.quick else kv_sharing.Size()
                for name in args.model or ["llama", "smollm2"]:
                    target = kv_models.llama(directory) if name == "llama" else kv_models.smollm2()
                    kv_sharing.sharing(
                        target,
                        repeats,
                        size,
                        cpu().removeprefix("CPU: "),
                        counted_row=args.sharing_rows != "served",
                        served_rows=args.sharing_rows != "counted",
                    )
            elif part == "growth":
                from bench.kv_growth import growth

                growth(
                    repeats, args.quick, cpu().removeprefix("CPU: "), args.growth_chats, args.growth_contexts
                )
            else:
                {"capacity": capacity, "preemption": preemption}[part](directory, repeats, args.quick)


if __name__ == "__main__":
    main()
