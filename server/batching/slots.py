"""SlotPool: the KV-cache slots of one generative model, handed out lowest-first, with token accounting."""

from __future__ import annotations

import heapq


class SlotPool:
    """Each slot holds one sequence of up to `context_length` tokens in the preallocated cache."""

    def __init__(self, slots: int, context_length: int) -> None:
        self.context_length = context_length
        self.capacity = slots
        self._free = list(range(slots))
        self._tokens: dict[int, int] = {}

    @property
    def in_use(self) -> int:
        return len(self._tokens)

    @property
    def tokens_in_use(self) -> int:
        return sum(self._tokens.values())

    def acquire(self) -> int | None:
        if not self._free:
            return None
        slot = heapq.heappop(self._free)  # lowest first keeps the running batch contiguous in the cache
        self._tokens[slot] = 0
        return slot

    def set_tokens(self, slot: int, tokens: int) -> None:
        if tokens > self.context_length:
            raise ValueError(f"slot {slot} would hold {tokens} tokens > context {self.context_length}")
        self._tokens[slot] = tokens

    def release(self, slot: int) -> None:
        del self._tokens[slot]
        heapq.heappush(self._free, slot)
