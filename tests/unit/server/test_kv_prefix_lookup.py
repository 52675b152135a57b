"""The prefix cache's lookup is linear in the prompt (issue 36, item 4): each prompt token is hashed once
per request and compared once per region holding it, whatever the prompt's length, and a joiner that
waits for memory is matched again at every step without hashing or comparing its prompt again."""

from __future__ import annotations

from array import array
from typing import SupportsIndex, overload

import pytest

from server.batching.memory import KvMemory
from server.batching.sequence import GenSequence
from server.batching.stream import TokenStream
from server.batching.text import TextAssembler
from server.domain import SamplingParams
from server.kv.arena import ALIGN, RegionArena
from server.kv.prefix import PrefixCache, block_hashes
from server.metrics import Metrics


class CountedTokens(list[int]):
    """A prompt that counts the tokens read from it by slicing (how hashing and comparing read it)."""

    read = 0

    @overload
    def __getitem__(self, index: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: SupportsIndex | slice) -> int | list[int]:
        if isinstance(index, slice):
            self.read += len(range(*index.indices(len(self))))
        return super().__getitem__(index)


class CountedArray(array):  # type: ignore[type-arg]
    """A region's token ids that count the ids read from them by slicing."""

    read = 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            self.read += len(range(*index.indices(len(self))))
        return super().__getitem__(index)


def tokens_of(n: int) -> list[int]:
    return [(7 * i + 3) % 32_000 for i in range(n)]


@pytest.mark.parametrize("n", [2048, 8192])
def test_a_lookup_reads_each_prompt_token_a_bounded_number_of_times(n: int) -> None:
    arena, cache = RegionArena(2 * n), PrefixCache(enabled=True)
    region = arena.allocate(n)
    assert region is not None
    cached = tokens_of(n)
    region.tokens, region.written = CountedArray("i", cached), n
    cache.register(region, "tenant:a")
    region.tokens.read = 0
    prompt = CountedTokens([*cached, 1])
    hit = cache.match(prompt, "tenant:a")
    assert hit is not None and hit.region is region and hit.tokens == n
    # Hashed once and compared once: 2n reads of each side at most (the old lookup compared the whole
    # prefix at every block: n * n / 32 reads, 131,072 at 2k tokens and 2.1 million at 8k).
    assert prompt.read <= 2 * n and region.tokens.read <= n


def test_a_collision_deep_in_the_prompt_keeps_the_blocks_before_it() -> None:
    arena, cache = RegionArena(4096), PrefixCache(enabled=True)
    region = arena.allocate(1024)
    assert region is not None
    cached = tokens_of(1024)
    region.tokens, region.written = array("i", cached), 1024
    cache.register(region, "tenant:a")
    region.tokens[40 * ALIGN + 3] = -1  # as a hash collision in block 40 would: its tokens differ
    hit = cache.match([*cached, 1], "tenant:a")
    assert hit is not None and hit.region is region and hit.tokens == 40 * ALIGN


def test_a_hit_across_two_regions_is_taken_whole_from_the_deeper_one() -> None:
    arena, cache = RegionArena(4096), PrefixCache(enabled=True)
    chat = tokens_of(1000)
    first, second = arena.allocate(400), arena.allocate(800)
    assert first is not None and second is not None
    first.tokens, first.written = array("i", chat[:400]), 400  # a chat's first turn
    second.tokens, second.written = array("i", chat[:800]), 800  # its second: the first turn's blocks
    cache.register(first, "s")  # stay the first region's, the new ones are the second's
    cache.register(second, "s")
    hit = cache.match(chat, "s")
    assert hit is not None and hit.region is second and hit.tokens == 800
    hit = cache.match(chat[:300], "s")
    assert hit is not None and hit.region is first and hit.tokens == 288


def test_a_grown_feed_extends_its_hashes_and_they_are_the_ones_from_scratch() -> None:
    from server.kv.prefix import FeedBlocks  # new with linear lookups

    cache, feed = PrefixCache(enabled=True), FeedBlocks()
    prompt = tokens_of(1000)
    assert cache.match(prompt, "s", feed) is None
    assert feed.hashes == block_hashes(prompt, "s", 999 // ALIGN)
    grown = CountedTokens([*prompt, *range(500)])  # a preempted sequence: its prompt and what it sent
    assert cache.match(grown, "s", feed) is None
    assert grown.read <= 1499 - 999 + 2 * ALIGN  # only the new blocks were hashed
    assert feed.hashes == block_hashes(list(grown), "s", 1499 // ALIGN)


def sequence(tokens: list[int], max_tokens: int) -> GenSequence:
    stream, text = TokenStream(4, lambda: None), TextAssembler(())
    return GenSequence(list(tokens), SamplingParams(max_tokens=max_tokens), 0, stream, text, 0.0, feed=tokens)


def test_a_joiner_waiting_for_memory_is_not_hashed_or_compared_again_at_each_step() -> None:
    n = 4096
    # Room for the holder's prompt and the joiner's region (n + 2 and the look-ahead of 32: n + 48), not
    # for both regions while the holder runs (its n and 32).
    memory = KvMemory(2 * n + 64, prefix_cache=True, metrics=Metrics(), model="m")
    shared = tokens_of(n)
    holder = sequence(list(shared), n // 2)
    assert memory.admit(holder, lambda victim: None)
    holder.planned = holder.prefilled = holder.position = n
    memory.prefilled(holder)  # its prompt is findable while it runs
    joiner = sequence(CountedTokens([*shared, 5, 6]), n // 2)
    assert not memory.admit(joiner, lambda victim: None)  # an equal never preempts: it waits
    first = joiner.feed.read  # type: ignore[attr-defined]
    assert 0 < first <= 2 * (n + 2)
    for _ in range(20):  # a step each: the joiner is matched again, by lookups alone
        assert not memory.admit(joiner, lambda victim: None)
    assert joiner.feed.read == first  # type: ignore[attr-defined]
    memory.release(holder)  # its region stays as a cached prefix, and memory is free again
    assert memory.admit(joiner, lambda victim: None)
    assert joiner.cached_tokens == n and joiner.feed.read == first  # type: ignore[attr-defined]
