"""The KV arena, the prefix cache and KvMemory (issue 19): exact-fit regions placed first-fit, compaction
that closes every hole, token-exact prefix hits scoped by the tenant's salt, LRU eviction before
compaction before preemption, and preemption only of lower-priority sequences, lowest ranked first."""

from __future__ import annotations

from array import array

from server.batching.memory import KvMemory
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import Priority, SamplingParams
from server.kv.arena import ALIGN, RegionArena
from server.kv.prefix import PrefixCache
from server.metrics import Metrics


def test_regions_are_exact_to_the_alignment_and_placed_first_fit() -> None:
    arena = RegionArena(10 * ALIGN)
    a, b, c = arena.allocate(20), arena.allocate(16), arena.allocate(1)
    assert a is not None and b is not None and c is not None
    assert [(r.base, r.size) for r in (a, b, c)] == [(0, 32), (32, 16), (48, 16)]
    arena.free(b)
    d = arena.allocate(5)  # the hole b left
    assert d is not None and d.base == 32
    assert arena.free_tokens() == 10 * ALIGN - 64 and arena.fragmentation() == 0.0
    assert arena.allocate(9 * ALIGN) is None


def test_compaction_closes_every_hole_and_says_what_to_move() -> None:
    arena = RegionArena(8 * ALIGN)
    regions = [arena.allocate(ALIGN) for _ in range(6)]
    assert all(regions)
    for index in (0, 2, 4):
        arena.free(regions[index])  # type: ignore[arg-type]
    for region in regions:
        if region is not None:
            region.written = 10
    assert arena.largest_hole() == 2 * ALIGN and arena.fragmentation() > 0.5
    assert arena.allocate(3 * ALIGN) is None
    moves = arena.compact()
    assert moves == [(16, 0, ALIGN), (48, 16, ALIGN), (80, 32, ALIGN)]
    assert arena.fragmentation() == 0.0 and arena.allocate(5 * ALIGN) is not None


def test_a_prefix_hit_is_token_exact_and_scoped_by_salt() -> None:
    arena, cache = RegionArena(64 * ALIGN), PrefixCache(enabled=True)
    tokens = list(range(100))
    region = arena.allocate(120)
    assert region is not None
    region.tokens, region.written = array("i", tokens), 100
    cache.register(region, "tenant:a")
    hit = cache.match([*tokens[:40], 7, 7], "tenant:a")
    assert hit is not None and hit.region is region and hit.tokens == 32  # two whole blocks
    assert cache.match(tokens[:40], "tenant:b") is None  # another tenant never sees it
    whole = cache.match(tokens, "tenant:a")
    assert whole is not None and whole.tokens == 96  # always one token left to compute
    region.tokens[3] = -1  # as a hash collision would: the tokens are checked, not just the hash
    assert cache.match(tokens, "tenant:a") is None
    cache.forget(region)
    assert len(cache) == 0


def sequence(
    prompt: int, max_tokens: int, priority: Priority = Priority.NORMAL, at: float = 0.0
) -> GenSequence:
    ids = list(range(prompt))
    return GenSequence(
        ids, SamplingParams(max_tokens=max_tokens), 0, TokenStream(4, lambda: None), TextAssembler(()), at,
        priority=priority, feed=list(ids),
    )  # fmt: skip


def running(memory: KvMemory, seq: GenSequence) -> GenSequence:
    assert memory.admit(seq, lambda victim: None)
    seq.planned = seq.prefilled = seq.position = len(seq.feed)
    memory.prefilled(seq)
    return seq


def test_memory_evicts_cached_prefixes_least_recently_used_first() -> None:
    memory = KvMemory(4 * 64, prefix_cache=True, metrics=Metrics(), model="m")
    first, second = running(memory, sequence(60, 4)), running(memory, sequence(60, 4))
    first_region, second_region = first.region, second.region
    memory.release(second)  # cached first: the least recently used of the two
    memory.release(first)
    assert memory.arena.cached() == 128
    big = sequence(180, 4)
    big.feed = [9] * 180  # no prefix in common
    assert memory.admit(big, lambda victim: None)
    assert memory.arena.cached() == 64 and first_region in memory.arena.regions
    assert second_region not in memory.arena.regions


def test_cached_prefixes_are_capped_in_number() -> None:
    memory = KvMemory(64 * 64, prefix_cache=True, metrics=Metrics(), model="m", max_cached=3)
    for _ in range(5):
        memory.release(running(memory, sequence(40, 4)))
    assert memory.arena.cached() == 3 * 48 and len(memory.arena.regions) == 3


def test_only_a_higher_priority_call_preempts_and_it_takes_the_lowest_ranked() -> None:
    memory = KvMemory(2 * 64, prefix_cache=False, metrics=Metrics(), model="m")
    older = running(memory, sequence(40, 20, Priority.LOW, at=0.0))
    younger = running(memory, sequence(40, 20, Priority.LOW, at=1.0))
    preempted: list[GenSequence] = []

    def preempt(victim: GenSequence) -> None:
        preempted.append(victim)
        memory.release(victim)

    assert not memory.admit(sequence(40, 20, Priority.LOW), preempt)  # an equal waits
    assert memory.admit(sequence(40, 20, Priority.HIGH), preempt)
    assert preempted == [younger] and older.region is not None
