"""Issue 36, the engine's metrics with the real scheduler and tiny byte LM. Item 9: a compaction of the KV
arena is counted where the arena compacts (sluice_kv_compactions_total) and its copies are timed on the
model's thread where they run (sluice_kv_compaction_seconds); the streams whose regions moved go on exactly
as they would have. Item 5: a preempted sequence's row in the step in flight is discarded as `preempted`,
not as a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch

from server.batching.continuous import ContinuousScheduler
from server.batching.requests import RequestLimits
from server.batching.sequence import GenSequence
from server.batching.worker import ModelWorker
from server.domain import GenerateSpec, Priority
from server.metrics import Metrics
from server.runtimes.byte_lm import ByteLm
from wire.sampling import Sampling

KV_TOKENS = 256  # four regions of 48: a prompt of 4 bytes and the look-ahead of 32, aligned


def submit(
    scheduler: ContinuousScheduler, prompt: str, max_tokens: int, priority: Priority = Priority.NORMAL
) -> GenSequence:
    sampling = Sampling.of({"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
    return scheduler.submit(
        GenerateSpec(
            model="byte-lm", prompt_text=prompt, prompt_ids=None, sampling=sampling, priority=priority
        )
    )


async def output(scheduler: ContinuousScheduler, seq: GenSequence) -> list[int]:
    return [t async for chunk in scheduler.chunks(seq) for t in chunk.token_ids]


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():  # noqa: ASYNC110 - the scheduler's state has no event of its own to wait on
        await asyncio.sleep(0.001)


def run(body: Callable[[ContinuousScheduler], Awaitable[None]]) -> Metrics:
    """Runs `body(scheduler)` beside a scheduler over a 256-token arena, prefix cache off; its metrics."""
    model = ByteLm(size="tiny", context_length=128, max_sequences=4, device=torch.device("cpu"))
    worker = ModelWorker("test")
    worker.call(model.allocate_cache, KV_TOKENS)
    metrics = Metrics()
    scheduler = ContinuousScheduler(
        model, worker, kv_tokens=KV_TOKENS, prefix_cache=False,
        limits=RequestLimits(context_length=128, default_max_tokens=16), stream_buffer=128,
        stall_timeout_s=30.0, breaker=None, metrics=metrics,
    )  # fmt: skip

    async def main() -> None:
        task = asyncio.create_task(scheduler.run())
        try:
            await asyncio.wait_for(body(scheduler), 60)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            worker.shutdown()

    asyncio.run(main())
    return metrics


def test_a_compaction_is_counted_and_its_copies_timed_and_the_moved_streams_go_on() -> None:
    outputs: dict[str, list[int]] = {}

    async def body(scheduler: ContinuousScheduler) -> None:
        # 40 tokens: 4 + 40 fit the first reservation (48), so no region grows here. The look-ahead is
        # kept where memory is short too (the fourth joins with 112 free: 32 short of 32 for each), so
        # that the layout below is exact.
        scheduler.memory.short_lookahead = scheduler.memory.lookahead
        a, b, c, d = (submit(scheduler, p, 40) for p in ("aaaa", "bbbb", "cccc", "dddd"))
        await until(lambda: all(s.generated >= 2 for s in (a, b, c, d)))
        # Within one turn of the loop: A and C leave at the next step boundary, two holes of 48 tokens at
        # 0 and 96 and one of 64 at the end; E needs 112 (70 + 32, aligned), which the free 160 hold and no
        # hole does.
        scheduler.cancel(a)
        scheduler.cancel(c)
        e = submit(scheduler, "e" * 70, 40)
        await until(lambda: e.region is not None)
        assert (b.base, d.base, e.base) == (0, 48, 96)  # B and D slid down while they ran
        outputs.update(
            b=await output(scheduler, b), d=await output(scheduler, d), e=await output(scheduler, e)
        )
        for name, prompt, tokens in (("b", "bbbb", 40), ("d", "dddd", 40), ("e", "e" * 70, 40)):
            outputs[name + " alone"] = await output(scheduler, submit(scheduler, prompt, tokens))

    metrics = run(body)
    value = metrics.registry.get_sample_value
    labels = {"model": "byte-lm"}
    assert value("sluice_kv_compactions_total", labels) == 1
    assert value("sluice_kv_compaction_seconds_count", labels) == 1
    assert 0 < (value("sluice_kv_compaction_seconds_sum", labels) or 0) < 5
    for name in ("b", "d", "e"):
        assert outputs[name] == outputs[name + " alone"], name


def test_a_preempted_sequences_row_in_flight_is_discarded_as_preempted() -> None:
    async def body(scheduler: ContinuousScheduler) -> None:
        # 96 + 32 each, reserved at once (the look-ahead reaches max_tokens): the arena.
        low = [submit(scheduler, p * 24, 32, Priority.LOW) for p in ("lo-a", "lo-b")]
        await until(lambda: all(s.generated >= 2 for s in low))
        high = submit(scheduler, "high", 60, Priority.HIGH)
        await until(lambda: any(s.epoch for s in low))  # preempted while its next step was in flight
        await output(scheduler, high)
        for seq in low:
            assert len(await output(scheduler, seq)) == 32  # resumed and finished: nothing to count there

    metrics = run(body)
    value = metrics.registry.get_sample_value
    discarded = {
        reason: value("sluice_tokens_discarded_total", {"model": "byte-lm", "reason": reason})
        for reason in ("cancelled", "finished", "preempted")
    }
    assert value("sluice_preemptions_total", {"model": "byte-lm"}) == 1
    # Its row in the step computing and, at most, in the one handed over behind it.
    assert discarded["preempted"] in (1, 2) and discarded["cancelled"] == discarded["finished"] == 0, (
        discarded
    )
    assert value("sluice_tokens_after_cancel_total", {"model": "byte-lm"}) == 0
