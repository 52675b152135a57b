"""WriteWatchdog: ends streaming calls whose peer accepts no data (it grants no HTTP/2 window) for its
timeout (twice the stall timeout), and gives back their admission slot at once.

Such a call is stuck inside grpc's write of one message, where no code of ours runs, so the scheduler's own
stall handling (which frees the KV slot) cannot reach it: without this, the peer keeps the gate slot until it
closes the socket. HTTP/2 cannot send trailers ahead of undelivered data and grpc.aio cannot reset a stream,
so the status (CANCELLED, ErrorInfo STALLED_CONSUMER) is queued behind that data: a peer that ever reads
again receives it; the stream's memory stays bounded by its flow-control window until the peer leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import grpc

from server.codec.status import to_grpc_status
from server.errors import StalledConsumer


class WatchedStream:
    """One stream's write clock: `writing_since` is set while grpc writes a message, 0 between writes."""

    __slots__ = ("context", "ended", "model", "release", "task", "writing_since")

    def __init__(
        self, context: grpc.aio.ServicerContext[Any, Any], model: str, release: Callable[[], None]
    ) -> None:
        self.context = context
        self.model = model
        self.release = release
        self.task = asyncio.current_task()
        self.writing_since = 0.0
        self.ended = False


class WriteWatchdog:
    def __init__(
        self,
        *,
        timeout_s: float,
        on_stall: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self._on_stall = on_stall
        self._clock = clock
        self._streams: set[WatchedStream] = set()
        self._aborts: set[asyncio.Task[None]] = set()

    def watch(
        self, context: grpc.aio.ServicerContext[Any, Any], model: str, release: Callable[[], None]
    ) -> WatchedStream:
        stream = WatchedStream(context, model, release)
        self._streams.add(stream)
        return stream

    def forget(self, stream: WatchedStream) -> None:
        self._streams.discard(stream)

    @property
    def watched(self) -> int:
        return len(self._streams)

    async def run(self) -> None:
        """Sweeps a few times per timeout: the per-message cost stays two attribute writes."""
        while True:
            await asyncio.sleep(max(self.timeout_s / 4, 0.01))
            self.sweep()

    def sweep(self) -> int:
        """Ends every stream whose current write began a timeout ago or more; returns how many."""
        now = self._clock()
        stalled = [s for s in self._streams if s.writing_since and now - s.writing_since >= self.timeout_s]
        for stream in stalled:
            self._end(stream)
        return len(stalled)

    def _end(self, stream: WatchedStream) -> None:
        self._streams.discard(stream)
        stream.ended = True
        stream.release()
        self._on_stall(stream.model)
        error = StalledConsumer(
            f"the peer accepted no data for {self.timeout_s:g}s (no flow-control window); stream ended"
        )
        abort = asyncio.create_task(_queue_status(stream.context, error))
        self._aborts.add(abort)
        abort.add_done_callback(self._aborts.discard)
        if stream.task is not None:
            stream.task.cancel()  # the handler's await on the blocked write


async def _queue_status(context: grpc.aio.ServicerContext[Any, Any], error: StalledConsumer) -> None:
    """Sends the status behind the undelivered data; the batch completes when the peer reads or leaves."""
    status = to_grpc_status(error)
    # abort raises once the status is out, and the batch fails if the peer left first: both end the same.
    with contextlib.suppress(Exception):
        await context.abort(status.code, status.details, status.trailing_metadata)
