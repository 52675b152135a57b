"""TokenStream: the bounded buffer between the scheduler and one Generate stream.

The scheduler only decodes a sequence while its stream has room, so a slow consumer pauses its own
sequence instead of growing a buffer; the final chunk has a reserved place and never waits for room.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from server.domain import TokenChunk


class TokenStream:
    def __init__(self, capacity: int, on_drain: Callable[[], None]) -> None:
        self.capacity = capacity
        self._chunks: deque[TokenChunk] = deque()
        self._final: TokenChunk | None = None
        self._ready = asyncio.Event()
        self._on_drain = on_drain

    def has_room(self, pending: int = 0) -> bool:
        """Room for one more chunk besides `pending` ones a step in flight will push."""
        return len(self._chunks) + pending < self.capacity

    def push(self, chunk: TokenChunk) -> None:
        self._chunks.append(chunk)
        self._ready.set()

    def finish(self, chunk: TokenChunk) -> None:
        if self._final is None:
            self._final = chunk
            self._ready.set()

    async def take(self) -> tuple[list[TokenChunk], TokenChunk | None]:
        """Waits for output, then returns everything buffered (coalesced by the caller) and the final chunk
        if the stream has ended; draining may resume a paused sequence."""
        await self._ready.wait()
        chunks = list(self._chunks)
        self._chunks.clear()
        final = self._final
        if final is None:
            self._ready.clear()
        if chunks:
            self._on_drain()
        return chunks, final


def merge(chunks: list[TokenChunk], final: TokenChunk | None) -> TokenChunk:
    """Coalesces what a consumer found buffered into one message (the final chunk's fields win)."""
    out = TokenChunk()
    for chunk in [*chunks, final] if final is not None else chunks:
        out.text += chunk.text
        out.token_ids.extend(chunk.token_ids)
        out.logprobs.extend(chunk.logprobs)
    if final is not None:
        out.finish_reason, out.usage, out.error = final.finish_reason, final.usage, final.error
        out.tool_calls, out.stop_sequence = final.tool_calls, final.stop_sequence
        out.timings = final.timings
    return out
