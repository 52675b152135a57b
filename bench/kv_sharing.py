"""bench.kv_cache's `sharing` part (issue 37, acceptance 2): shared prefixes referenced in place against
today's copies, side by side in one run, on the seeded 8k Llama and on SmolLM2 (--model), the prefix cache
on throughout and the system prompt seen once before (a cached prefix), each figure the median of the
repeats with their range; the real server's rows on two servers at once (on and off), each repeat's row
run on one then the other, the order alternating:

- KV held at the peak (the real server's reserved + shared gauges, sampled every 0.2 s): 32 streams sharing
  a 2,000-token system prompt with 64-token user turns, 256 new tokens each (ignore_eos), against the bound
  1.25 x (2,000 + 32 x 320) and against --prefix-sharing false;
- sequences running at once in a fixed budget of 65,536 KV tokens (count-based, the server's scheduler
  in-process, bench/kv_inprocess.py: 256 such streams offered at once, counted when the first finishes):
  sharing on, outputs held as written, against today's (sharing off, prompt + max_tokens reserved on
  joining); target 4x;
- tokens/s of the 32 sharing streams (aggregate over the wall, and one stream's decode rate), on against
  off, target 1.3x; and of 32 streams with no prefix in common, target within 3%.

    .venv/bin/python -m bench.kv_cache --part sharing [--model llama|smollm2] [--repeats N] [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from dataclasses import dataclass, field

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench import kv_inprocess
from bench.generate import percentile, spread
from bench.kv_models import Target
from bench.stack import SluiceServer
from server.domain import GenerateSpec
from wire.sampling import Sampling

SYSTEM, TURN, NEW, BUDGET, OFFERED = 2000, 64, 256, 65536, 256
MODES = ("on", "off")
CHUNK = 256  # in-process prefill per step: the offered streams are in within 64 steps (memory decides)


@dataclass(frozen=True)
class Size:
    streams: int = 32
    new: int = NEW
    offered: int = OFFERED
    budget: int = BUDGET


QUICK = Size(streams=8, new=32, offered=48, budget=16384)


@dataclass
class Streams:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    outputs: dict[str, list[int]] = field(default_factory=dict)
    decoding: list[tuple[int, float]] = field(default_factory=list)  # per stream: tokens after its first, s
    shared_peak: float = 0.0  # KV tokens attended in place by several sequences (the gauge), at most

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def stream_rate(self) -> float:
        """One stream's decode speed (tokens/s after its first token), averaged over the streams."""
        return sum(n for n, _ in self.decoding) / sum(s for _, s in self.decoding)


def sharing(
    target: Target, repeats: int, size: Size, cpu: str, counted_row: bool = True, served_rows: bool = True
) -> None:
    """`counted_row` False: the real server's rows only (the timed ones; the count needs no quiet);
    `served_rows` False: the in-process count alone (running at once in the budget)."""
    rng = random.Random(5)
    system = [rng.randrange(target.vocab) for _ in range(SYSTEM)]
    counted = {mode: _counted(target, system, mode, repeats, size) if counted_row else [] for mode in MODES}
    if not served_rows:
        print(f"\nsharing ({target.label}; {cpu}): {size.streams} streams, a {SYSTEM}-token system prompt")
        _report_counted(counted, size, cpu)
        return
    _report(target, _served(target, system, repeats, size), counted, size, cpu)


def _prompts(target: Target, system: list[int], repeat: int, count: int) -> tuple[list[list[int]], ...]:
    turn = random.Random(50 + repeat)  # the same prompts in both modes
    shared = [[*system, *(turn.randrange(target.vocab) for _ in range(TURN))] for _ in range(count)]
    fresh = [[turn.randrange(target.vocab) for _ in range(SYSTEM + TURN)] for _ in range(count)]
    return shared, fresh


Counted = list[kv_inprocess.Held]
Served = dict[str, list[tuple[Streams, float]]]  # row -> per repeat: the streams, KV held at the peak


def _served(target: Target, system: list[int], repeats: int, size: Size) -> dict[str, Served]:
    """The real server at the budget, sharing on and off side by side (two servers, each repeat's rows
    run on one then the other, the order alternating: drift over the run falls on both alike): the
    shared and no-prefix rows, KV held at the peak (gauges)."""
    rows: dict[str, Served] = {mode: {"shared": [], "none": []} for mode in MODES}
    budget = ("--kv-cache-bytes", str(size.budget * target.bytes_per_token))
    with contextlib.ExitStack() as stack:
        servers = {
            mode: stack.enter_context(target.serve("--prefix-sharing", str(mode == "on").lower(), *budget))
            for mode in MODES
        }
        for s in servers.values():
            asyncio.run(
                _measured(s, target.name, [[*system, 1]], 4)
            )  # the system prompt has been seen before
        for repeat in range(repeats):
            shared, fresh = _prompts(target, system, repeat, size.streams)
            for row, prompts in (("shared", shared), ("none", fresh)):
                for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                    rows[mode][row].append(
                        asyncio.run(_measured(servers[mode], target.name, prompts, size.new))
                    )
    return rows


def _counted(
    target: Target, system: list[int], mode: str, repeats: int, size: Size
) -> list[kv_inprocess.Held]:
    """The scheduler in-process: `offered` sharing streams at once in the budget, until the first ends."""

    def spec(ids: list[int], new: int) -> GenerateSpec:
        sampling = Sampling(max_tokens=new, temperature=0.0, ignore_eos=True)
        return GenerateSpec(model=target.name, prompt_text=None, prompt_ids=tuple(ids), sampling=sampling)

    model = target.load(8192, size.offered)  # both models' context
    runs = []
    for repeat in range(repeats):
        shared, _ = _prompts(target, system, repeat, size.offered)
        specs = [spec(p, size.new) for p in shared]
        held = kv_inprocess.run(
            model, specs, kv_tokens=size.budget, sharing=mode == "on", upfront=mode == "off",
            warm=spec([*system, 1], 4), stop_at_first_finish=True, prefill_chunk_tokens=CHUNK,
        )  # fmt: skip
        runs.append(held)
    return runs


def _report(
    target: Target,
    served: dict[str, Served],
    counted: dict[str, list[kv_inprocess.Held]],
    size: Size,
    cpu: str,
) -> None:
    n, new = size.streams, size.new
    print(
        f"\nsharing ({target.label}; {cpu}): {n} streams, a {SYSTEM}-token system prompt + {TURN}-token "
        f"turns, {new} tokens each; on: --prefix-sharing true, outputs held as written; off: false"
    )
    held = {m: [h for _, h in served[m]["shared"]] for m in MODES}
    referenced = {m: [s.shared_peak for s, _ in served[m]["shared"]] for m in MODES}
    ideal = SYSTEM + n * (TURN + new)
    print(
        f"  KV held at the peak, on against off: {spread(held['on'])} against {spread(held['off'])} tokens "
        f"({statistics.median(held['off']) / statistics.median(held['on']):.2f}x less); on / ({SYSTEM} + "
        f"{n} x {TURN + new}) = {statistics.median(held['on']) / ideal:.2f} (target <= 1.25); of it "
        f"referenced in place (sluice_kv_tokens_shared at the peak): {spread(referenced['on'])} against "
        f"{spread(referenced['off'])} [{cpu}]"
    )
    if counted["on"]:
        _report_counted(counted, size, cpu)
    else:
        print("  running at once in a budget: not run (--sharing-rows served)")
    _report_timed(served, n, cpu)


def _report_counted(counted: dict[str, list[kv_inprocess.Held]], size: Size, cpu: str) -> None:
    first = {m: [float(h.at_first_finish) for h in counted[m]] for m in MODES}
    peak = {m: [float(h.peak) for h in counted[m]] for m in MODES}
    preempted = [h.preemptions for h in counted["on"]]
    print(
        f"  running at once in {size.budget:,} KV tokens ({size.offered} such streams offered, counted when "
        f"the first finished; in-process scheduler), sharing on against today's (sharing off, prompt + "
        f"max_tokens reserved on joining): {spread(first['on'])} (peak {spread(peak['on'])}, "
        f"{spread(preempted)} preemptions) against {spread(first['off'])} = "
        f"{statistics.median(first['on']) / statistics.median(first['off']):.1f}x (target >= 4x) [{cpu}]"
    )


def _report_timed(served: dict[str, Served], n: int, cpu: str) -> None:
    for row, what, target_text in (
        ("shared", f"{n} sharing streams", "target >= 1.3x"),
        ("none", f"{n} streams with no prefix in common", "target 0.97-1.03x"),
    ):
        on, off = ([s for s, _ in served[m][row]] for m in ("on", "off"))
        tps = [[s.tokens_per_s for s in runs] for runs in (on, off)]
        rate = [[s.stream_rate for s in runs] for runs in (on, off)]
        ttft = [[percentile(s.ttft, 50) for s in runs] for runs in (on, off)]
        paired = [a / b for a, b in zip(tps[0], tps[1], strict=True)]  # each repeat's on over its off
        print(
            f"  tokens/s of {what}, on against off: aggregate {spread(tps[0])} against {spread(tps[1])} "
            f"= {statistics.median(tps[0]) / statistics.median(tps[1]):.2f}x, per repeat "
            f"{spread(paired, digits=2)} ({target_text}); one stream's "
            f"decode {spread(rate[0], digits=1)} against {spread(rate[1], digits=1)} = "
            f"{statistics.median(rate[0]) / statistics.median(rate[1]):.2f}x; TTFT p50 "
            f"{spread(ttft[0], 1000)} against {spread(ttft[1], 1000)} ms [{cpu}]"
        )
    same = [
        sum(a.outputs[k] == b.outputs[k] for k in a.outputs)
        for (a, _), (b, _) in zip(served["on"]["shared"], served["off"]["shared"], strict=True)
    ]
    print(f"  sharing streams' outputs token-identical on and off: {min(same)}-{max(same)} of {n}")


async def _measured(s: SluiceServer, model: str, prompts: list[list[int]], new: int) -> tuple[Streams, float]:
    """The streams at once, the server's KV gauges sampled meanwhile: (the streams, KV held at the peak:
    own regions and the prefixes attended in place)."""
    peak, stop, into = [0.0], asyncio.Event(), Streams()

    async def watch() -> None:
        while not stop.is_set():
            held = s.metric("sluice_kv_tokens_reserved", model=model)
            shared = s.metric("sluice_kv_tokens_shared", model=model)
            peak[0], into.shared_peak = max(peak[0], held + shared), max(into.shared_peak, shared)
            await asyncio.sleep(0.2)  # a sampler, not a wait on a condition

    async def one(stub: pb_grpc.InferenceServiceStub, key: str, ids: list[int]) -> None:
        request = pb.GenerateRequest(
            model=model, token_ids=pb.TokenIds(ids=ids),
            sampling=pb.SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True),
        )  # fmt: skip
        started, got, first, last = time.perf_counter(), [], 0.0, 0.0
        async for message in stub.Generate(request, timeout=1800):
            if message.token_ids:
                last = time.perf_counter()
                if not got:
                    into.ttft.append(last - started)
                    first, after = last, len(message.token_ids)
            got.extend(message.token_ids)
        into.tokens += len(got)
        into.outputs[key] = got
        if last > first:
            into.decoding.append((len(got) - after, last - first))

    watcher = asyncio.create_task(watch())
    async with grpc.aio.insecure_channel(s.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(one(stub, str(i), p) for i, p in enumerate(prompts)))
        into.wall_s = time.perf_counter() - started
    stop.set()
    await watcher
    return into, peak[0]
