"""PrefixCache: which arena regions hold the keys and values of which token prefixes.

Blocks of ALIGN tokens are named by a chained hash of every token before them and the tenant's cache salt
(vLLM's automatic prefix caching), so a hit is the longest run of leading blocks whose hashes are known,
checked token by token. Finished sequences leave their region behind as a cached entry, evicted least
recently used when memory is wanted; running sequences' prompts are found too.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from server.kv.arena import ALIGN, Region


@dataclass(frozen=True, slots=True)
class Hit:
    region: Region
    tokens: int  # leading tokens whose keys and values are in `region` from its base


def block_hashes(tokens: Sequence[int], salt: str, blocks: int) -> list[int]:
    hashes, previous = [], hash(salt)
    for block in range(blocks):
        previous = hash((previous, tuple(tokens[block * ALIGN : (block + 1) * ALIGN])))
        hashes.append(previous)
    return hashes


class PrefixCache:
    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._blocks: dict[int, tuple[Region, int]] = {}  # block hash -> (region, block index)

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, tokens: Sequence[int], salt: str) -> Hit | None:
        """The longest cached prefix of `tokens`, leaving at least one token to compute (its logits are the
        first token's distribution)."""
        if not self.enabled:
            return None
        best: Hit | None = None
        for index, digest in enumerate(block_hashes(tokens, salt, (len(tokens) - 1) // ALIGN)):
            found = self._blocks.get(digest)
            if found is None or found[1] != index:
                break
            region = found[0]
            end = (index + 1) * ALIGN
            if region.salt != salt or region.written < end or region.tokens[:end] != array("i", tokens[:end]):
                break  # a hash collision, or a block not yet written: never a wrong prefix
            best = Hit(region, end)
        return best

    def register(self, region: Region, salt: str) -> None:
        """Makes the region's full blocks findable (after its prompt or more is written)."""
        if not self.enabled:
            return
        region.salt = salt
        full = min(region.written, len(region.tokens)) // ALIGN
        if full <= len(region.hashes):
            return
        region.hashes = block_hashes(region.tokens, salt, full)
        for index, digest in enumerate(region.hashes):
            self._blocks.setdefault(digest, (region, index))

    def forget(self, region: Region) -> None:
        """The region is freed or evicted: its blocks are no longer found there."""
        for digest in region.hashes:
            if self._blocks.get(digest, (None, 0))[0] is region:
                del self._blocks[digest]
        region.hashes = []
