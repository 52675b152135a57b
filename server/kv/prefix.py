"""PrefixCache: which arena regions hold the keys and values of which token prefixes.

Blocks of ALIGN tokens are named by a chained hash of every token before them and the tenant's cache salt
(vLLM's automatic prefix caching), so a hit is the longest run of leading blocks whose hashes are known,
checked token by token. Finished sequences leave their region behind as a cached entry, evicted least
recently used when memory is wanted; running sequences' prompts are found too. A lookup is linear in the
prompt: its hashes are computed once per request (FeedBlocks) and the tokens are compared once per region.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from server.kv.arena import ALIGN, Region


class PrefixEvents(Protocol):
    """Where the cache reports what it makes findable and forgets (server/kv/events.py publishes it)."""

    def stored(
        self, hashes: list[int], parent: int | None, tokens: list[int], salt: str, first: bool
    ) -> None: ...

    def removed(self, hashes: list[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class Hit:
    region: Region
    tokens: int  # leading tokens whose keys and values are in `region` from its base


@dataclass(slots=True)
class FeedBlocks:
    """What the cache learnt about one request's feed, kept on the request so that a joiner waiting for
    memory is matched again at every step by dictionary lookups alone: the feed's block hashes, extended
    (never recomputed) when the feed grows, and the region last found to hold its first `verified` tokens.
    Valid because a feed only grows (a preempted sequence's is its prompt and what it sent) under one salt,
    and a region's tokens are only ever appended to."""

    hashes: list[int] = field(default_factory=list)
    region: Region | None = None
    verified: int = 0


def block_hashes(tokens: Sequence[int], salt: str, blocks: int, known: Sequence[int] = ()) -> list[int]:
    """The chained hashes of the first `blocks` blocks; `known`, those of a first few already computed."""
    hashes = list(known[:blocks])
    previous = hashes[-1] if hashes else hash(salt)
    for block in range(len(hashes), blocks):
        previous = hash((previous, tuple(tokens[block * ALIGN : (block + 1) * ALIGN])))
        hashes.append(previous)
    return hashes


def common_blocks(region: Region, tokens: Sequence[int], blocks: int) -> int:
    """How many of the first `blocks` blocks `region` holds exactly as `tokens` has them: one comparison in
    C when all do (the usual case), block by block after a hash collision."""
    end = min(blocks * ALIGN, region.written, len(region.tokens)) // ALIGN * ALIGN
    if end == blocks * ALIGN and region.tokens[:end] == array("i", tokens[:end]):
        return blocks
    for block in range(end // ALIGN):
        at = block * ALIGN
        if region.tokens[at : at + ALIGN] != array("i", tokens[at : at + ALIGN]):
            return block
    return end // ALIGN


class PrefixCache:
    def __init__(self, *, enabled: bool, events: PrefixEvents | None = None) -> None:
        self.enabled = enabled
        self.events = events  # --kv-events-endpoint: each block found or forgotten, published
        self._blocks: dict[int, tuple[Region, int]] = {}  # block hash -> (region, block index)

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, tokens: Sequence[int], salt: str, feed: FeedBlocks | None = None) -> Hit | None:
        """The longest cached prefix of `tokens`, leaving at least one token to compute (its logits are the
        first token's distribution). `feed`: what earlier lookups of the same request (or of a shorter
        feed it grew from) learnt, updated here."""
        if not self.enabled:
            return None
        feed = FeedBlocks() if feed is None else feed
        usable = (len(tokens) - 1) // ALIGN
        if len(feed.hashes) < usable:
            feed.hashes = block_hashes(tokens, salt, usable, feed.hashes)
        # The deepest known block names the region: its chained hash covers every block before it.
        deepest: tuple[Region, int] | None = None
        for index in range(usable):
            found = self._blocks.get(feed.hashes[index])
            if found is None or found[1] != index:
                break
            deepest = found[0], index + 1
        if deepest is None:
            return None
        region, blocks = deepest
        if region.salt != salt:
            return None  # a hash collision across tenants: never another tenant's prefix
        if region is not feed.region or feed.verified < blocks * ALIGN:
            feed.region, feed.verified = region, common_blocks(region, tokens, blocks) * ALIGN
        tokens_held = min(feed.verified, blocks * ALIGN)
        return Hit(region, tokens_held) if tokens_held else None

    def register(self, region: Region, salt: str, known: Sequence[int] = ()) -> None:
        """Makes the region's full blocks findable (after its prompt or more is written). `known`: hashes
        of its leading blocks already computed (its feed's), so a prompt is hashed once."""
        if not self.enabled:
            return
        region.salt = salt
        full = min(region.written, len(region.tokens)) // ALIGN
        if full <= len(region.hashes):
            return
        before = len(region.hashes)
        region.hashes = block_hashes(region.tokens, salt, full, region.hashes or known)
        stored = [
            i
            for i, digest in enumerate(region.hashes)
            if self._blocks.setdefault(digest, (region, i))[0] is region
        ]
        if self.events is not None and (new := [i for i in stored if i >= before]):
            first, last = new[0], new[-1] + 1  # blocks are stored in order: one run
            tokens = list(region.tokens[first * ALIGN : last * ALIGN])
            parent = region.hashes[first - 1] if first else None
            self.events.stored(region.hashes[first:last], parent, tokens, salt, first == 0)

    def forget(self, region: Region) -> None:
        """The region is freed or evicted: its blocks are no longer found there."""
        removed = []
        for digest in region.hashes:
            if self._blocks.get(digest, (None, 0))[0] is region:
                del self._blocks[digest]
                removed.append(digest)
        if self.events is not None:
            self.events.removed(removed)
        region.hashes = []
