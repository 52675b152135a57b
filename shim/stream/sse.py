"""Server-sent events for every API family: the framing of a named event, the `: ping` heartbeat, and the
response class that carries a family's events with the headers proxies need to pass them unbuffered (also
a family's stream of another media type, such as Ollama's newline-delimited JSON)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from shim import jsonio

PING = b": ping\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(event: str, data: Any) -> bytes:
    """One SSE event; the JSON is compact and on one line, so a single `data:` field always suffices."""
    return b"event: " + event.encode() + b"\ndata: " + jsonio.dumps(data) + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response (or `media_type`'s) that runs `on_close` however the stream ends.

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
        media_type: str | None = None,
    ) -> None:
        self._events = events
        self._finished = False
        media_type = media_type or self.media_type
        super().__init__(self._relay(), headers=SSE_HEADERS, media_type=media_type, background=background)
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
