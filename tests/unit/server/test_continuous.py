"""ContinuousScheduler with the real tiny byte LM: joins and leaves at step boundaries, pause/resume for
slow consumers, stall timeout, KV-slot accounting, limits, and batch-independent seeded sampling."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest
import torch

from server.batching.continuous import ContinuousScheduler
from server.batching.requests import RequestLimits
from server.batching.sequence import GenSequence
from server.batching.worker import ModelWorker
from server.domain import FinishReason, GenerateSpec, TokenChunk
from server.errors import InvalidArgument, LimitExceeded
from server.metrics import Metrics
from server.runtimes.base import Prefill
from server.runtimes.byte_lm import ByteLm
from wire.sampling import Sampling


class RecordingLm(ByteLm):
    """The real model, logging which regions each step's prefills and decode rows touched: a region by the
    order its base was first seen (the first sequence's is 0), so a freed and reused base keeps its id."""

    def __init__(self) -> None:
        super().__init__(size="tiny", context_length=128, max_sequences=4, device=torch.device("cpu"))
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.ids: dict[int, int] = {}

    def forward(
        self,
        prefills: Sequence[Prefill],
        bases: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        computing: Callable[[], None] = lambda: None,
    ) -> torch.Tensor:
        for p in prefills:
            self.calls.append(("prefill", (self.ids.setdefault(p.base, len(self.ids)),)))
        if bases:
            self.calls.append(("decode", tuple(self.ids.setdefault(b, len(self.ids)) for b in bases)))
        return self.adjust(super().forward(prefills, bases, tokens, positions, computing=computing))

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


@dataclass
class Harness:
    model: RecordingLm = field(default_factory=RecordingLm)
    buffer: int = 64
    stall_s: float = 30.0

    def __post_init__(self) -> None:
        self.worker = ModelWorker("test")
        self.worker.call(self.model.allocate_cache, 4 * 128)
        self.scheduler = ContinuousScheduler(
            self.model,
            self.worker,
            kv_tokens=4 * 128,
            prefix_cache=False,
            limits=RequestLimits(context_length=128, default_max_tokens=16),
            stream_buffer=self.buffer,
            stall_timeout_s=self.stall_s,
            breaker=None,
            metrics=Metrics(),
        )

    def submit(self, prompt: str, **kw: object) -> GenSequence:
        spec = GenerateSpec(model="byte-lm", prompt_text=prompt, prompt_ids=None, sampling=Sampling.of(kw))
        return self.scheduler.submit(spec)


def drive(harness: Harness, body: Callable[[Harness], Awaitable[None]]) -> None:
    async def main() -> None:
        task = asyncio.create_task(harness.scheduler.run())
        try:
            await asyncio.wait_for(body(harness), 60)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            harness.worker.shutdown()

    asyncio.run(main())


async def collect(h: Harness, seq: GenSequence) -> list[TokenChunk]:
    return [c async for c in h.scheduler.chunks(seq)]


async def until(predicate: Callable[[], bool]) -> None:
    """Waits for a condition on the scheduler's state, checked between event-loop turns."""
    while not predicate():  # noqa: ASYNC110 - the state has no event of its own to wait on
        await asyncio.sleep(0.001)


def tokens(chunks: list[TokenChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def test_sequences_join_and_leave_at_step_boundaries() -> None:
    async def body(h: Harness) -> None:
        a = h.submit("first", max_tokens=40, temperature=0.0)
        await until(lambda: a.generated >= 5)
        b = h.submit("second", max_tokens=5, temperature=0.0)
        await collect(h, b)
        await until(lambda: a.done)
        calls = h.model.calls
        assert calls[0] == ("prefill", (0,))
        b_prefill = calls.index(("prefill", (1,)))
        # B joined at a boundary: its prefill shares a step with A's decode; from the next step on both
        # decode in one batch.
        assert all(c == ("decode", (0,)) for c in calls[1:b_prefill])
        assert calls[b_prefill + 1] == ("decode", (0,))
        assert calls[b_prefill + 2] == ("decode", (0, 1))
        # B left after its 5th token (1 from prefill, 4 from decode steps): A decodes alone again.
        both = [i for i, c in enumerate(calls) if c == ("decode", (0, 1))]
        assert len(both) == 4
        assert all(c == ("decode", (0,)) for c in calls[both[-1] + 1 :])
        await collect(h, a)
        assert h.scheduler.memory.holders == 0 and h.scheduler.memory.written == 0

    drive(Harness(), body)


def test_cancel_frees_the_slot_before_the_next_step() -> None:
    async def body(h: Harness) -> None:
        a = h.submit("cancel me", max_tokens=100)
        keep = h.submit("keep going", max_tokens=60)
        await until(lambda: a.generated >= 3)
        slot = h.model.ids[a.base]
        h.scheduler.cancel(a)
        steps_at_cancel = len(h.model.calls)
        await until(lambda: h.scheduler.memory.holders == 1)
        # The step computing when it was cancelled and the one already handed over behind it (lookahead.py)
        # may hold it; no step planned after the cancel does.
        assert all(slot not in c[1] for c in h.model.calls[steps_at_cancel + 2 :])
        assert a.generated <= 5
        final = await collect(h, keep)
        assert final[-1].finish_reason is FinishReason.LENGTH
        assert h.scheduler.memory.holders == 0

    drive(Harness(), body)


def test_slow_consumer_is_paused_then_resumes_without_losing_tokens() -> None:
    async def body(h: Harness) -> None:
        slow = h.submit("slow", max_tokens=30, seed=9)
        fast = h.submit("fast", max_tokens=30, seed=10)
        fast_chunks = await collect(h, fast)
        assert fast_chunks[-1].finish_reason is FinishReason.LENGTH
        # The slow stream's buffer (2 chunks) filled; its sequence was skipped while fast ran on.
        assert slow.generated == 2 and not slow.done and slow.paused_since is not None
        decode_steps = [c for c in h.model.calls if c[0] == "decode"]
        assert decode_steps[-1][1] == (h.model.ids[fast.base],) if fast.region is not None else True
        slow_chunks = await collect(h, slow)
        assert len(tokens(slow_chunks)) == 30 and slow_chunks[-1].usage is not None
        assert slow_chunks[-1].usage.completion_tokens == 30

    drive(Harness(buffer=2), body)


def test_stalled_consumer_is_cancelled_and_its_memory_freed() -> None:
    async def body(h: Harness) -> None:
        stalled = h.submit("stall", max_tokens=50)
        await until(lambda: stalled.done)
        chunks = await collect(h, stalled)
        final = chunks[-1]
        assert final.finish_reason is FinishReason.CANCELLED
        assert final.error is not None and final.error.reason == "STALLED_CONSUMER"
        await until(lambda: h.scheduler.memory.holders == 0)

    drive(Harness(buffer=2, stall_s=0.05), body)


def test_kv_accounting_tracks_every_token() -> None:
    async def body(h: Harness) -> None:
        a = h.submit("abcd", max_tokens=10, temperature=0.0)
        b = h.submit("xy", max_tokens=20, temperature=0.0)
        await until(lambda: a.done)
        # A's slot may already be gone; B's tokens are counted as written to its slot.
        await until(lambda: h.scheduler.memory.holders == 1)
        assert h.scheduler.memory.written == b.position
        await collect(h, b)
        await collect(h, a)
        assert h.scheduler.memory.written == 0

    drive(Harness(), body)


def test_seeded_output_is_independent_of_batch_mates() -> None:
    async def body(h: Harness) -> None:
        alone = tokens(await collect(h, h.submit("seeded", max_tokens=24, seed=1234, temperature=0.9)))
        others = [h.submit(f"noise {i}", max_tokens=24, seed=i) for i in range(3)]
        crowd = h.submit("seeded", max_tokens=24, seed=1234, temperature=0.9)
        together = tokens(await collect(h, crowd))
        for seq in others:
            await collect(h, seq)
        assert alone == together

    drive(Harness(), body)


def test_requests_that_cannot_fit_are_refused_naming_the_limit() -> None:
    h = Harness()
    with pytest.raises(LimitExceeded) as info:
        h.submit("x" * 100, max_tokens=50)
    assert info.value.field == "sampling.max_tokens" and "context_length" in info.value.message
    with pytest.raises(LimitExceeded) as info:
        h.submit("x" * 200)
    assert info.value.field == "text"
    h.worker.shutdown()


class EagerEosLm(RecordingLm):
    """Prefers the end-of-sequence token above all others: greedy decoding ends at once unless told not to."""

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.eos_id] = 1e4
        return logits


def test_min_tokens_masks_eos_until_reached_and_ignore_eos_runs_to_max_tokens() -> None:
    async def body(h: Harness) -> None:
        eos = h.model.eos_id
        plain = await collect(h, h.submit("x", max_tokens=10, temperature=0.0))
        assert tokens(plain) == [eos] and plain[-1].finish_reason is FinishReason.STOP
        held = await collect(h, h.submit("x", max_tokens=10, temperature=0.0, min_tokens=5))
        assert eos not in tokens(held)[:5] and tokens(held)[5] == eos
        assert held[-1].finish_reason is FinishReason.STOP and held[-1].usage.completion_tokens == 6
        fixed = await collect(h, h.submit("x", max_tokens=10, temperature=0.0, ignore_eos=True))
        assert len(tokens(fixed)) == 10 and fixed[-1].finish_reason is FinishReason.LENGTH

    drive(Harness(model=EagerEosLm()), body)


def test_min_tokens_beyond_max_tokens_is_refused() -> None:
    async def body(h: Harness) -> None:
        with pytest.raises(InvalidArgument) as info:
            h.submit("x", max_tokens=4, min_tokens=5)
        assert info.value.field == "sampling.min_tokens"

    drive(Harness(), body)


class GatedLm(RecordingLm):
    """Each decode step, once its long call begins (`computing`), waits for the stream to receive the step
    before it: the previous step's tokens must reach the event loop while this one computes."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered = threading.Event()
        self.waits: list[bool] = []

    def forward(
        self,
        prefills: Sequence[Prefill],
        bases: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        computing: Callable[[], None] = lambda: None,
    ) -> torch.Tensor:
        def gate() -> None:
            computing()
            if bases:
                self.waits.append(self.delivered.wait(timeout=5))
                self.delivered.clear()

        return super().forward(prefills, bases, tokens, positions, computing=gate)


def test_a_steps_tokens_are_delivered_while_the_next_step_computes() -> None:
    async def body(h: Harness) -> None:
        assert isinstance(h.model, GatedLm)
        seq = h.submit("x", max_tokens=6, temperature=0.0, ignore_eos=True)
        received = []
        async for chunk in h.scheduler.chunks(seq):
            received.extend(chunk.token_ids)
            h.model.delivered.set()
        assert len(received) == 6 and h.model.waits == [True] * 5

    drive(Harness(model=GatedLm()), body)
