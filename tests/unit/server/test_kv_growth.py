"""Issue 37, item 3: outputs held as written. A sequence reserves its feed and a bounded look-ahead, grows in
place or by moving its region as it decodes, and when memory runs out the lowest-ranked running sequence
(itself included) is preempted and resumed through the prefix cache: greedy output stays token for token
what it is alone. A request without max_tokens runs to the context's end (or EOS)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from server.batching.continuous import ContinuousScheduler
from server.batching.memory import LOOKAHEAD, KvMemory
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import FinishReason, Priority, SamplingParams, TokenChunk
from server.kv.arena import ALIGN, aligned
from server.metrics import Metrics
from tests.support.scheduler import run_scheduler, submit


def sequence(prompt: int, max_tokens: int, at: float = 0.0, start: int = 0) -> GenSequence:
    ids = list(range(start, start + prompt))
    return GenSequence(
        ids, SamplingParams(max_tokens=max_tokens), 0, TokenStream(4, lambda: None), TextAssembler(()), at,
        priority=Priority.NORMAL, feed=list(ids),
    )  # fmt: skip


def decoding(memory: KvMemory, seq: GenSequence) -> GenSequence:
    assert memory.admit(seq, lambda victim: None)
    seq.planned = seq.prefilled = seq.position = len(seq.feed)
    memory.prefilled(seq)
    return seq


def test_a_sequence_reserves_its_feed_and_the_look_ahead_not_its_max_tokens() -> None:
    memory = KvMemory(64 * ALIGN, prefix_cache=False, metrics=Metrics(), model="m")
    long_one = decoding(memory, sequence(40, 500))
    assert long_one.region is not None and long_one.region.size == aligned(40 + LOOKAHEAD)
    short = decoding(memory, sequence(40, 3))  # never more than it can write
    assert short.region is not None and short.region.size == aligned(43)
    assert memory.arena.reserved() == aligned(40 + LOOKAHEAD) + aligned(43)


def test_growth_is_in_place_where_free_and_a_move_where_not() -> None:
    memory = KvMemory(64 * ALIGN, prefix_cache=False, metrics=Metrics(), model="m")
    first = decoding(memory, sequence(40, 500))
    assert first.region is not None
    size = first.region.size
    assert memory.grow(first, size, lambda victim: None)  # nothing after it: in place
    assert first.region.base == 0 and first.region.size == aligned(size + 1 + LOOKAHEAD)
    assert memory.take_moves() == ([], [])
    second = decoding(memory, sequence(40, 500))
    assert second.region is not None and second.region.base == first.region.size
    old = first.region.size
    assert memory.grow(first, old, lambda victim: None)  # the second follows it: it moves whole
    moves, _ = memory.take_moves()
    assert moves == [(0, first.region.base, old)] and first.region.base > second.region.base
    third = decoding(memory, sequence(10, 5))
    assert third.region is not None and third.region.base == 0  # its old place is free at once


def test_out_of_memory_growth_preempts_the_lowest_ranked_itself_included() -> None:
    memory = KvMemory(2 * 80 + ALIGN, prefix_cache=False, metrics=Metrics(), model="m")
    older = decoding(memory, sequence(40, 100, at=0.0))
    younger = decoding(memory, sequence(40, 100, at=1.0, start=500))
    preempted: list[GenSequence] = []

    def preempt(victim: GenSequence) -> None:
        preempted.append(victim)
        memory.release(victim)

    assert older.region is not None
    assert memory.grow(older, older.region.size, preempt)  # the younger yields
    assert preempted == [younger] and older.region.size > 80
    again = decoding(memory, sequence(40, 100, at=2.0, start=900))
    assert again.region is not None
    assert not memory.grow(again, again.region.size, preempt)  # now the youngest: it yields itself
    assert preempted == [younger, again] and again.region is None and older.region is not None


# -- the scheduler, with the real byte LM --------------------------------------------------------------


def run(kv_tokens: int, context: int, body: Callable[[ContinuousScheduler], Awaitable[None]]) -> Metrics:
    return run_scheduler(
        body, kv_tokens=kv_tokens, context=context, max_sequences=8, timeout_s=120, prefill_chunk_tokens=16,
        stall_timeout_s=30.0,
    )  # fmt: skip


async def chunks(scheduler: ContinuousScheduler, seq: GenSequence) -> list[TokenChunk]:
    return [c async for c in scheduler.chunks(seq)]


def test_without_max_tokens_a_stream_runs_to_the_context_end() -> None:
    got: list[TokenChunk] = []

    async def body(scheduler: ContinuousScheduler) -> None:
        got.extend(
            await chunks(scheduler, submit(scheduler, "tell me more", temperature=0.0, ignore_eos=True))
        )

    run(256, 256, body)
    assert sum(len(c.token_ids) for c in got) == 256 - len("tell me more") > 128
    assert got[-1].finish_reason is FinishReason.LENGTH


def test_growth_under_memory_pressure_preempts_and_every_output_is_as_alone() -> None:
    prompts = [f"stream {i}: go on" for i in range(4)]
    alone: dict[str, list[int]] = {}
    together: dict[str, list[int]] = {}
    peak: list[int] = []

    async def body(scheduler: ContinuousScheduler) -> None:
        for prompt in prompts:
            seq = submit(scheduler, prompt, temperature=0.0, ignore_eos=True)
            alone[prompt] = [t for c in await chunks(scheduler, seq) for t in c.token_ids]
        publish = scheduler.gauges.sequences

        def record(active: int, runnable: int, memory: KvMemory) -> None:  # at every iteration
            peak.append(memory.arena.reserved())
            publish(active, runnable, memory)

        scheduler.gauges.sequences = record  # type: ignore[method-assign]
        seqs = [submit(scheduler, prompt, temperature=0.0, ignore_eos=True) for prompt in prompts]
        outputs = await asyncio.gather(*(chunks(scheduler, s) for s in seqs))
        together.update(
            {p: [t for c in out for t in c.token_ids] for p, out in zip(prompts, outputs, strict=True)}
        )

    # 4 streams of up to 128 tokens in 320: all join (48 each), and grow until some must yield.
    metrics = run(320, 128, body)
    assert together == alone
    assert all(len(tokens) == 128 - len(prompts[0]) for tokens in alone.values())
    assert (metrics.registry.get_sample_value("sluice_preemptions_total", {"model": "byte-lm"}) or 0) > 0
    assert max(peak) <= 320


def test_where_memory_is_short_a_region_grows_by_one_block() -> None:
    # Room for LOOKAHEAD more tokens per holder: a region grows by the look-ahead. Short of that (others
    # will wait for what it holds unwritten), to the position it writes, to the arena's alignment.
    roomy = KvMemory(64 * ALIGN, prefix_cache=False, metrics=Metrics(), model="m")
    first = decoding(roomy, sequence(40, 500))
    assert first.region is not None
    size = first.region.size
    assert roomy.grow(first, size, lambda victim: None)
    assert first.region.size == aligned(size + 1 + LOOKAHEAD)
    tight = KvMemory(2 * 80 + ALIGN, prefix_cache=False, metrics=Metrics(), model="m")
    one, two = decoding(tight, sequence(40, 500)), decoding(tight, sequence(40, 500, start=500))
    assert one.region is not None and two.region is not None
    assert tight.grow(two, two.region.size, lambda victim: None)  # 16 tokens free: in place, one block
    assert two.region.size == 80 + ALIGN and tight.arena.free_tokens() == 0
    three = sequence(40, 500, start=900)  # 40 of 56 left: a joiner then reserves its feed alone
    shorter = KvMemory(2 * 80 + 48, prefix_cache=False, metrics=Metrics(), model="m")
    decoding(shorter, sequence(40, 500)), decoding(shorter, sequence(40, 500, start=500))
    assert decoding(shorter, three).region is not None and three.region.size == aligned(40)
    assert shorter.arena.free_tokens() == 0  # with 32 ahead (80 tokens) it would have waited
