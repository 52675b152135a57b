"""The shim's own in-flight bound: an ASGI middleware that refuses API requests past `max_inflight`
with 503 SHIM_OVERLOADED before any body is read, and holds each slot until the response, SSE
streams included, has ended."""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from shim.errors import shim_overloaded

API_PREFIX = "/v1/"


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

    def try_acquire(self) -> bool:
        if self._inflight >= self.limit:
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


class InflightMiddleware:
    """Wraps the app so that admission is decided from the request line alone, before body or routing."""

    def __init__(self, app: ASGIApp, *, bound: InflightBound) -> None:
        self.app = app
        self.bound = bound

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Probes must answer even when the shim is saturated, so only the API counts.
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        if not self.bound.try_acquire():
            error = shim_overloaded(self.bound.limit)
            response = JSONResponse(error.to_json(), status_code=error.status, headers=error.headers)
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.bound.release()
