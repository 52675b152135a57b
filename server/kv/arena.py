"""RegionArena: the KV cache's token axis, handed out as exact-fit contiguous regions.

A sequence reserves, at admission, its feed plus a bounded look-ahead rounded up to ALIGN tokens, and its
region grows as it decodes: in place where the tokens after it are free, else by moving it whole to a
hole that holds it (one contiguous region, so attention reads each sequence's keys as one zero-copy view).
Holes are filled first-fit; when the free tokens would hold a request but no hole does, `compact` slides
the regions down. Moves are returned for the model to apply before its next step (docs/kv-cache.md).
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field

#: Regions start and end on this many tokens: the prefix cache's block, and what keeps holes reusable.
ALIGN = 16


def aligned(tokens: int) -> int:
    return -(-tokens // ALIGN) * ALIGN


@dataclass(eq=False, slots=True)
class Region:
    """Tokens [base, base + size) of the arena; `written` of them hold keys and values."""

    base: int
    size: int
    written: int = 0
    owned: bool = True  # held by a running sequence; False: a cached prefix, evictable when refs is 0
    refs: int = 0  # running sequences (other than its own) attending its leading tokens in place
    last_used: float = 0.0
    tokens: array[int] = field(default_factory=lambda: array("i"))  # ids of the written positions
    hashes: list[int] = field(default_factory=list)  # the prefix cache's block hashes registered for it
    salt: str = ""


class RegionArena:
    """First-fit allocation over `capacity` tokens, regions sorted by base."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity - capacity % ALIGN
        self._regions: list[Region] = []  # sorted by base
        self._bases: list[int] = []
        self._reserved = self._cached = 0  # tokens of owned and of cached regions

    @property
    def regions(self) -> list[Region]:
        return self._regions

    def allocate(self, tokens: int) -> Region | None:
        """The lowest hole that holds `tokens` (rounded up to ALIGN), or None."""
        size = aligned(max(tokens, 1))
        at = 0
        for index, region in enumerate(self._regions):
            if region.base - at >= size:
                return self._insert(index, Region(at, size))
            at = region.base + region.size
        if self.capacity - at >= size:
            return self._insert(len(self._regions), Region(at, size))
        return None

    def free(self, region: Region) -> None:
        index = bisect.bisect_left(self._bases, region.base)
        assert self._regions[index] is region
        del self._regions[index], self._bases[index]
        self._count(region, -1)

    def disown(self, region: Region) -> None:
        """The region's sequence left; the region stays as a cached prefix."""
        self._count(region, -1)
        region.owned = False
        self._count(region, 1)

    def shrink(self, region: Region, tokens: int) -> None:
        """Gives back the region's tail beyond `tokens` (a finished sequence keeps what it wrote)."""
        self._count(region, -1)
        region.size = min(region.size, aligned(max(tokens, 1)))
        self._count(region, 1)

    def extend(self, region: Region, tokens: int) -> bool:
        """Grows the region in place to `tokens` (rounded up to ALIGN) where the tokens after it are free."""
        size = aligned(tokens)
        index = bisect.bisect_left(self._bases, region.base)
        limit = self._bases[index + 1] if index + 1 < len(self._bases) else self.capacity
        if region.base + size > limit:
            return False
        self._count(region, -1)
        region.size = max(region.size, size)
        self._count(region, 1)
        return True

    def relocate(self, region: Region, tokens: int) -> tuple[int, int, int] | None:
        """Moves the region to the lowest hole that holds `tokens` (rounded up to ALIGN), which never overlaps
        its old place; returns the (source, destination, tokens) copy, None where no hole holds it. The old
        place is free at once: the copy runs before the next step's, in the order moves were planned."""
        spot = self.allocate(tokens)
        if spot is None:
            return None
        move = (region.base, spot.base, region.size)
        self.free(spot)
        self.free(region)
        region.base, region.size = spot.base, spot.size
        self._insert(bisect.bisect_left(self._bases, region.base), region)
        return move

    def compact(self) -> list[tuple[int, int, int]]:
        """Slides every region down to close the holes; returns (source, destination, tokens) moves in the
        order they must run (ascending, so no move overwrites a region not yet moved). Whole regions move:
        the step in flight when they are planned may still write past what the scheduler has seen."""
        moves = []
        at = 0
        for index, region in enumerate(self._regions):
            if region.base != at:
                moves.append((region.base, at, region.size))
                region.base = at
                self._bases[index] = at
            at += region.size
        return moves

    # -- accounting --------------------------------------------------------------------------------
    def reserved(self) -> int:
        """Tokens held by running sequences."""
        return self._reserved

    def cached(self) -> int:
        """Tokens held by cached prefixes (evictable)."""
        return self._cached

    def free_tokens(self) -> int:
        return self.capacity - self._reserved - self._cached

    def largest_hole(self) -> int:
        at, best = 0, 0
        for region in self._regions:
            best = max(best, region.base - at)
            at = region.base + region.size
        return max(best, self.capacity - at)

    def fragmentation(self) -> float:
        """1 - largest hole / free tokens: 0 when the free memory is one hole."""
        free = self.free_tokens()
        return 0.0 if free == 0 else 1.0 - self.largest_hole() / free

    def _insert(self, index: int, region: Region) -> Region:
        self._regions.insert(index, region)
        self._bases.insert(index, region.base)
        self._count(region, 1)
        return region

    def _count(self, region: Region, sign: int) -> None:
        if region.owned:
            self._reserved += sign * region.size
        else:
            self._cached += sign * region.size
