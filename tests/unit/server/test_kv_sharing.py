"""Issue 37, items 1 and 4, acceptance 1 and 3, with the real scheduler and byte LM: streams whose prompt
begins as a cached or running one reference its region (the prompt is held once, their own regions hold
their suffix and output), with outputs as with sharing off; a burst of one prompt (n > 1 choices) waits
for the first to be in and then shares it; the cache evicts no referenced prefix; tenants share only
under the same salt."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Awaitable, Callable

from server.batching.continuous import ContinuousScheduler
from server.batching.extras import RequestExtras
from server.batching.memory import KvMemory
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import SamplingParams
from server.metrics import Metrics
from tests.support.scheduler import run_scheduler, submit

PROMPT = "".join(chr(97 + (7 * i) % 26) for i in range(632))  # 632 bytes: 632 tokens


def run(
    body: Callable[[ContinuousScheduler], Awaitable[None]], *, sharing: bool, kv_tokens: int = 16384
) -> Metrics:
    return run_scheduler(
        body, kv_tokens=kv_tokens, context=1024, max_sequences=32, timeout_s=300, prefix_sharing=sharing,
        prefill_chunk_tokens=32, stall_timeout_s=60.0,
    )  # fmt: skip


async def tokens(scheduler: ContinuousScheduler, seq: GenSequence) -> list[int]:
    return [t async for chunk in scheduler.chunks(seq) for t in chunk.token_ids]


def watch(scheduler: ContinuousScheduler, seen: list[tuple[int, float, float]]) -> None:
    """Records at every iteration, once the gauges are published: KV held, and the reserved and shared
    gauges as Prometheus reads them."""
    publish, value = scheduler.gauges.sequences, scheduler.gauges._kv

    def record(active: int, runnable: int, memory: KvMemory) -> None:
        publish(active, runnable, memory)
        seen.append((memory.held, value[2]._value.get(), value[5]._value.get()))

    scheduler.gauges.sequences = record  # type: ignore[method-assign]


def streams(sharing: bool, count: int, new: int) -> tuple[list[list[int]], list[tuple[int, float, float]]]:
    outputs: list[list[int]] = []
    seen: list[tuple[int, float, float]] = []

    async def body(scheduler: ContinuousScheduler) -> None:
        watch(scheduler, seen)
        seqs = [
            submit(scheduler, PROMPT, max_tokens=new, seed=i, temperature=0.8, ignore_eos=True)
            for i in range(count)
        ]
        outputs.extend(await asyncio.gather(*(tokens(scheduler, seq) for seq in seqs)))

    run(body, sharing=sharing)
    return outputs, seen


def test_sixteen_streams_sharing_a_prompt_hold_it_once_and_write_the_same_tokens() -> None:
    shared, seen = streams(True, 16, 300)
    peak = max(held for held, _, _ in seen)
    assert peak <= (632 + 16 * 300) * 1.1, peak  # acceptance 1: not sixteen copies
    assert max(gauge for _, _, gauge in seen) >= 624  # the gauges say it: 39 blocks attended in place
    # The same streams' first 40 tokens with sharing off (each prefix copied): the same tokens.
    copied, seen_off = streams(False, 16, 40)
    assert [out[:40] for out in shared] == copied and all(len(out) == 300 for out in shared)
    assert max(held for held, _, _ in seen_off) >= 16 * 632  # sharing off: each holds its own copy


def test_n8_choices_of_one_prompt_hold_it_once() -> None:
    _, seen = streams(True, 8, 40)
    # Acceptance 3, read from the gauges: at the peak the prompt is attended in place once (its blocks),
    # and the eight own regions hold the rest: the first choice's whole prompt and 7 suffixes.
    reserved = max(gauge for _, gauge, _ in seen)
    assert max(gauge for _, _, gauge in seen) >= 624
    assert reserved <= (632 + 40 + 32) + 7 * (8 + 40 + 32), reserved


def sequence(prompt: list[int], salt: str) -> GenSequence:
    stream, text = TokenStream(4, lambda: None), TextAssembler(())
    return GenSequence(
        prompt, SamplingParams(max_tokens=8), 0, stream, text, 0.0, extras=RequestExtras(salt=salt),
        feed=list(prompt),
    )  # fmt: skip


def test_a_referenced_prefix_is_not_evicted_and_tenants_share_only_under_one_salt() -> None:
    memory = KvMemory(400, prefix_cache=True, metrics=Metrics(), model="m", sharing=True, min_shared=1)
    prompt = list(range(100))
    first = sequence(prompt, "a")
    assert memory.admit(first, lambda victim: None)
    first.planned = first.prefilled = first.position = 100
    memory.prefilled(first)
    memory.release(first)  # its region stays, cached
    sharer = sequence([*prompt[:64], 7, 7, 7], "a")
    assert memory.admit(sharer, lambda victim: None)
    assert sharer.shared is not None and sharer.shared_tokens == 64 and memory.shared == 112
    assert sharer.region is not None and sharer.region.size == 16  # its 3 tokens and its 8 at most
    assert memory.take_moves() == ([], [])  # nothing copied
    other = sequence([*prompt[:64], 9], "b")  # another tenant's salt: no hit, its own copy
    assert memory.admit(other, lambda victim: None) and other.shared is None and other.prefilled == 0
    big = sequence(list(range(500, 700)), "a")  # needs the cached region's memory: it is referenced
    assert not memory.admit(big, lambda victim: None)
    memory.release(sharer)  # the last reference goes: the prefix is evictable again
    assert memory.admit(big, lambda victim: None)
    assert big.region is not None and array("i", big.feed) == big.region.tokens


def test_a_sharer_that_leaves_is_cached_whole_for_the_next_turn() -> None:
    memory = KvMemory(1024, prefix_cache=True, metrics=Metrics(), model="m", sharing=True, min_shared=1)
    prompt, mine = list(range(100)), list(range(500, 516))
    first = sequence(prompt, "")
    assert memory.admit(first, lambda victim: None)
    first.planned = first.prefilled = first.position = 100
    memory.prefilled(first)
    turn = sequence([*prompt[:80], *mine], "")
    assert memory.admit(turn, lambda victim: None) and turn.shared_tokens == 80
    assert turn.region is not None
    own = turn.region.base
    turn.planned = turn.prefilled = turn.position = 96
    memory.prefilled(turn)
    turn.produced, turn.generated, turn.position = [8, 9], 2, 97
    memory.wrote(turn, 8)  # its first output's keys are in; the second's not yet
    turn.done = True  # it finished (a preempted one is not copied: memory is wanted then)
    memory.release(turn)
    moves, _ = memory.take_moves()
    hit = memory.prefix.match([*prompt[:80], *mine, 8, 9], "")  # the next turn: six blocks, the sixth its own
    assert hit is not None and hit.tokens == 96 and hit.region is not first.region
    assert hit.region.tokens == array("i", [*prompt[:80], *mine, 8]) and hit.region.written == 97
    assert moves == [(first.base, hit.region.base, 80), (own, hit.region.base + 80, 17)]
    assert first.region is not None and first.region.refs == 0


def test_a_sharer_that_leaves_a_full_arena_evicts_older_prefixes_to_be_cached_whole() -> None:
    # Once the arena is full of cached prefixes (a server's steady state), the next turn's whole is still
    # cached: the least recently used prefixes go, not the one it copies. Before, it was dropped, and a
    # chat's turns found only the last turn cached while a hole was free, one turn more behind each time.
    memory = KvMemory(512, prefix_cache=True, metrics=Metrics(), model="m", sharing=True, min_shared=1)

    def cache(prompt: list[int]) -> None:
        seq = sequence(prompt, "")
        assert memory.admit(seq, lambda victim: None)
        seq.planned = seq.prefilled = seq.position = len(prompt)
        memory.prefilled(seq)
        memory.release(seq)

    prompt, mine = list(range(100)), list(range(500, 516))
    cache(prompt)
    first = memory.prefix.match(prompt, "")
    assert first is not None
    for other in range(4):  # older conversations fill the rest: 16 tokens stay free
        cache(list(range(1000 * (other + 1), 1000 * (other + 1) + 96)))
    assert memory.arena.largest_hole() < 112
    turn = sequence([*prompt[:80], *mine], "")
    assert memory.admit(turn, lambda victim: None) and turn.shared_tokens == 80
    turn.planned = turn.prefilled = turn.position = 96
    memory.prefilled(turn)
    turn.produced, turn.generated, turn.position = [8, 9], 2, 97
    memory.wrote(turn, 8)
    turn.done = True
    memory.release(turn)
    memory.take_moves()
    hit = memory.prefix.match([*prompt[:80], *mine, 8, 9], "")
    assert hit is not None and hit.tokens == 96 and hit.region is not first.region
    source = memory.prefix.match(prompt, "")  # the prefix it copied stays
    assert source is not None and source.region is first.region
    assert memory.prefix.match(list(range(1000, 1096)), "") is None  # the oldest went


def test_a_whole_that_holds_all_of_the_prefix_it_copied_replaces_it() -> None:
    # One copy of a conversation, found in the newest region alone: had the prefix stayed, it would name
    # the whole's leading blocks, and its eviction (the least recently used) would hide the whole.
    memory = KvMemory(1024, prefix_cache=True, metrics=Metrics(), model="m", sharing=True, min_shared=1)
    prompt, mine = list(range(96)), list(range(500, 516))
    first = sequence(prompt, "")
    assert memory.admit(first, lambda victim: None)
    first.planned = first.prefilled = first.position = 96
    memory.prefilled(first)
    memory.release(first)
    source = memory.prefix.match([*prompt, 1], "")
    assert source is not None and source.tokens == 96
    turn = sequence([*prompt, *mine], "")
    assert memory.admit(turn, lambda victim: None) and turn.shared_tokens == 96
    turn.planned = turn.prefilled = turn.position = 112
    memory.prefilled(turn)
    turn.produced, turn.generated, turn.position = [8], 1, 113
    memory.wrote(turn, 8)
    turn.done = True
    memory.release(turn)
    moves, _ = memory.take_moves()
    assert moves[0][0] == source.region.base  # the copy from it was queued before its space was freed
    hit = memory.prefix.match([*prompt, 1], "")
    assert hit is not None and hit.tokens == 96 and hit.region is not source.region
    whole = memory.prefix.match([*prompt, *mine, 8, 9], "")
    assert whole is not None and whole.region is hit.region and whole.tokens == 112
    assert memory._evict({id(whole.region)}) == 0  # nothing else is cached


def test_a_preempted_sharer_frees_its_own_part_and_caches_nothing_of_it() -> None:
    memory = KvMemory(1024, prefix_cache=True, metrics=Metrics(), model="m", sharing=True, min_shared=1)
    prompt = list(range(100))
    first = sequence(prompt, "")
    assert memory.admit(first, lambda victim: None)
    first.planned = first.prefilled = first.position = 100
    memory.prefilled(first)
    sharer = sequence([*prompt[:64], 1, 2, 3], "")
    assert memory.admit(sharer, lambda victim: None) and sharer.shared is first.region
    sharer.planned = sharer.prefilled = sharer.position = 67
    memory.prefilled(sharer)
    regions, reserved = len(memory.arena.regions), memory.arena.reserved()
    memory.release(sharer)  # preempted: not done
    assert len(memory.arena.regions) == regions - 1 and memory.arena.cached() == 0
    assert memory.arena.reserved() == reserved - 16 and first.region is not None and first.region.refs == 0
    assert memory.take_moves() == ([], [])
    hit = memory.prefix.match([1, 2, 3, *range(40)], "")  # its own tokens were never registered as a prefix
    assert hit is None
