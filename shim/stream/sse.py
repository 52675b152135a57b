"""Server-sent events: the framing of one event, the `: ping` heartbeat, the terminal events,
and the response class that carries them with the headers proxies need to pass them unbuffered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from shim import jsonio
from shim.errors import ErrorBody

PING = b": ping\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event: str, data: Any) -> bytes:
    """One SSE event; the JSON is compact and on one line, so a single `data:` field always suffices."""
    return b"event: " + event.encode() + b"\ndata: " + jsonio.dumps(data) + b"\n\n"


def token_event(text: str, token_ids: list[int]) -> bytes:
    return frame("token", {"text": text, "token_ids": token_ids})


def done_event(finish_reason: str, usage: dict[str, int], error: ErrorBody | None = None) -> bytes:
    data: dict[str, Any] = {"finish_reason": finish_reason, "usage": usage}
    if error is not None:
        data["error"] = error.to_json()
    return frame("done", data)


def error_event(error: ErrorBody) -> bytes:
    return frame("error", {"error": error.to_json()})


async def heartbeats_until(pending: asyncio.Future[Any], *, interval_s: float) -> AsyncIterator[bytes]:
    """Yields a `: ping` for every quiet `interval_s` until `pending` is done, which it never cancels.

    Cancelling a grpc.aio read cancels the whole RPC, so a quiet stream waits on the read
    rather than timing it out.
    """
    while True:
        done, _ = await asyncio.wait({pending}, timeout=interval_s)
        if done:
            return
        yield PING


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response that runs `on_close` however the stream ends.

    The body generator's own `finally` does not run if the response fails before the first
    iteration (e.g. the client left before the headers went out); `on_close` covers that path.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        on_close: Callable[[], object],
        background: BackgroundTask | None = None,
    ) -> None:
        self._events = events
        self._finished = False
        super().__init__(
            self._relay(), headers=SSE_HEADERS, media_type=self.media_type, background=background
        )
        self._on_close = on_close

    async def _relay(self) -> AsyncIterator[bytes]:
        async for event in self._events:
            yield event
        self._finished = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = scope["app"].state.metrics if "app" in scope else None
        if metrics is not None:
            metrics.open_streams.inc()
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            if metrics is not None:
                metrics.open_streams.dec()
                if not self._finished:  # the client left, or the stream broke, before its last event
                    metrics.disconnects.labels(scope["path"]).inc()
