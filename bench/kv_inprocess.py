"""The server's continuous scheduler over a real runtime, in-process, for bench.kv_cache's count-based rows
(issue 37): requests submitted to the scheduler itself, and what its KV memory holds read at every
iteration (the hook its gauges are published from) and at every finish, not sampled over the wire.

"Today's" reservation is the same scheduler with its look-ahead past any max_tokens: every sequence holds
its prompt and max_tokens from the moment it joins, as the arena did before outputs were held as written.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from server.batching.continuous import ContinuousScheduler
from server.batching.memory import KvMemory
from server.batching.requests import RequestLimits
from server.batching.sequence import GenSequence
from server.batching.worker import ModelWorker
from server.domain import GenerateSpec
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel

#: Look-ahead of today's reservation: past any max_tokens, so a sequence holds its limit on joining.
UPFRONT = 1 << 30


@dataclass
class Held:
    """What the scheduler's memory held, at every iteration and at every finish."""

    running: list[int] = field(default_factory=list)  # sequences holding memory, per iteration
    # Sequences queued to join (or rejoin) per iteration, from the first preemption on (0 before it).
    waiting: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # KV tokens running sequences hold, per iteration
    written: list[int] = field(default_factory=list)  # of them, written (a shared prefix once), per iteration
    # Of the held tokens not written, per iteration: in regions of sequences whose feed is not all in yet
    # (joining, or rejoining after a preemption to be recomputed), beyond the chunks already computed.
    prefilling: list[int] = field(default_factory=list)
    chunks_in: list[int] = field(default_factory=list)  # of `written`, chunks of feeds not all in yet
    lengths: list[int] = field(default_factory=list)  # each finished sequence's prompt + output tokens
    at_first_finish: int = 0  # sequences holding memory when the first one finished (itself included)
    outputs: dict[int, list[int]] = field(default_factory=dict)  # per spec, as far as it got before any stop
    finished: set[int] = field(default_factory=set)  # the specs that ended (EOS or the context) before it
    preemptions: float = 0.0
    compactions: float = 0.0

    @property
    def peak(self) -> int:
        return max(self.running, default=0)

    @property
    def bound(self) -> list[int]:
        """Sequences running at the iterations when others waited for memory (the memory-bound phase)."""
        return [r for r, w in zip(self.running, self.waiting, strict=True) if w]

    @property
    def bound_median(self) -> float:
        return statistics.median(self.bound) if self.bound else float(self.peak)

    def used(self, budget: int) -> list[float]:
        """Written tokens / the budget at the memory-bound iterations: running at once / what the tokens
        they have written would fit (budget / their mean written tokens), the same running set."""
        return self.at_bound(self.written, budget)

    def at_bound(self, tokens: list[int], budget: int) -> list[float]:
        """`tokens` (one figure per iteration) / the budget at the memory-bound iterations."""
        return [t / budget for t, n in zip(tokens, self.waiting, strict=True) if n]


def load(path: Path, *, name: str, context: int, max_sequences: int, dtype: torch.dtype) -> GenerativeModel:
    """The checkpoint (a directory or a GGUF file) on the native decoder, as `--hf-models` serves it."""
    from server.runtimes.hf_causal import load_hf_causal

    torch.set_num_threads(1)  # as the server rows' --torch-threads 1
    return load_hf_causal(
        path, name=name, context_length=context, max_sequences=max_sequences, device=torch.device("cpu"),
        dtype=dtype,
    )  # fmt: skip


def run(
    model: GenerativeModel,
    specs: list[GenerateSpec],
    *,
    kv_tokens: int,
    sharing: bool,
    upfront: bool = False,
    warm: GenerateSpec | None = None,
    stop_at_first_finish: bool = False,
    stop_after_bound: int = 0,
    max_bound_steps: int = 0,
    prefill_chunk_tokens: int = 32,
    timeout_s: float = 3600.0,
) -> Held:
    """Submits `specs` at once (after `warm`, run alone first: a prompt the cache has seen) to a fresh
    scheduler over `model` with `kv_tokens` of KV memory; returns what it held. `stop_at_first_finish`
    ends the run when the first sequence finishes; `stop_after_bound` > 0, once sequences have waited for
    memory and then none has for that many iterations in a row (the burst's memory-bound wave is over:
    what remains runs without waiting); `max_bound_steps` > 0, after that many memory-bound iterations.
    A stopped run cancels the rest."""
    worker = ModelWorker(model.descriptor.name)
    worker.call(model.allocate_cache, kv_tokens)
    metrics, held, context = Metrics(), Held(), model.descriptor.limits.context_length
    scheduler = ContinuousScheduler(
        model, worker, kv_tokens=kv_tokens, limits=RequestLimits(context_length=context),
        metrics=metrics, prefix_cache=True, prefix_sharing=sharing, stream_buffer=1 << 16,
        stall_timeout_s=600.0, breaker=None, prefill_chunk_tokens=prefill_chunk_tokens,
    )  # fmt: skip
    memory = scheduler.memory
    if upfront:
        memory.lookahead = memory.short_lookahead = UPFRONT
    stop = asyncio.Event()

    async def tokens(seq: GenSequence) -> None:
        async for _ in scheduler.chunks(seq):
            pass

    async def body() -> None:
        if warm is not None:
            await tokens(scheduler.submit(warm))
        seqs = [scheduler.submit(spec) for spec in specs]
        _watch(
            scheduler, memory, held, stop, at_first_finish=stop_at_first_finish, after_bound=stop_after_bound,
            max_bound=max_bound_steps,
        )  # fmt: skip
        done = asyncio.gather(*(tokens(seq) for seq in seqs))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((done, stopped), return_when=asyncio.FIRST_COMPLETED)
        held.outputs = {i: list(seq.produced) for i, seq in enumerate(seqs)}  # as far as each got
        held.finished = {i for i, seq in enumerate(seqs) if seq.done and seq.cancel_step is None}
        for task in (done, stopped):
            task.cancel()
        await asyncio.gather(done, stopped, return_exceptions=True)

    async def main() -> None:
        task = asyncio.create_task(scheduler.run())
        try:
            await asyncio.wait_for(body(), timeout_s)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            worker.shutdown()

    asyncio.run(main())
    value, labels = metrics.registry.get_sample_value, {"model": model.descriptor.name}
    held.preemptions = value("sluice_preemptions_total", labels) or 0.0
    held.compactions = value("sluice_kv_compactions_total", labels) or 0.0
    return held


def _watch(
    scheduler: ContinuousScheduler, memory: KvMemory, held: Held, stop: asyncio.Event, *,
    at_first_finish: bool, after_bound: int, max_bound: int,
) -> None:  # fmt: skip
    """Records at every iteration (where the gauges are published) and at every sequence's finish; sets
    `stop` as run()'s stop rules say."""
    publish, release = scheduler.gauges.sequences, memory.release
    # Joiners wait for the step's prefill budget too (a burst goes in over a few steps): memory binds
    # from the first preemption on (a sequence that ran waits to rejoin).
    bound = [False]
    steps = [0]  # memory-bound iterations so far

    def record(active: int, runnable: int, kv: KvMemory) -> None:
        publish(active, runnable, kv)
        bound[0] = bound[0] or any(s.first_step >= 0 for s in scheduler.joining)
        held.running.append(kv.holders)
        held.waiting.append(len(scheduler.joining) if bound[0] else 0)
        held.held.append(kv.held)
        shared = {id(s.shared): s.shared for s in scheduler.active if s.shared is not None}
        going_in = [(s, s.region) for s in scheduler.active if s.prefilled < len(s.feed) and s.region]
        # A feed's chunks already in hold keys and values: written, though the region says so only once
        # the whole feed is in (KvMemory.prefilled registers its blocks then).
        chunks = sum(max(s.prefilled - s.shared_tokens - r.written, 0) for s, r in going_in)
        held.chunks_in.append(chunks)
        held.written.append(kv.written + sum(region.written for region in shared.values()) + chunks)
        held.prefilling.append(sum(r.size - r.written for _, r in going_in) - chunks)
        steps[0] += bool(held.waiting[-1])
        quiet = held.waiting[-after_bound:]
        if after_bound and bound[0] and len(quiet) == after_bound and not any(quiet):
            stop.set()  # the memory-bound wave is over
        if max_bound and steps[0] >= max_bound:
            stop.set()

    def released(seq: GenSequence) -> None:
        if seq.done and seq.cancel_step is None and seq.region is not None:  # finished, not cancelled
            if not held.lengths:
                held.at_first_finish = memory.holders
                if at_first_finish:
                    stop.set()
            held.lengths.append(len(seq.prompt) + len(seq.produced))
        release(seq)

    scheduler.gauges.sequences = record  # type: ignore[method-assign]
    memory.release = released  # type: ignore[method-assign]
