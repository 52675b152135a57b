"""The shim's own in-flight bound: how many API requests hold a slot at once (`--max-inflight`), SSE streams
until their last event; the admission middleware takes and releases the slots, /readyz reports them."""

from __future__ import annotations

import asyncio


class InflightBound:
    """Counts requests holding a slot; one event loop owns it, so no lock is needed."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_inflight must be at least 1, got {limit}")
        self.limit = limit
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def full(self) -> bool:
        return self._inflight >= self.limit

    def try_acquire(self) -> bool:
        if self.full:
            return False
        self._inflight += 1
        self._idle.clear()
        return True

    def release(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Returns once no request holds a slot; lets shutdown and tests wait on streams to finish."""
        await self._idle.wait()
