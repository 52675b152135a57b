"""Watching the HTTP client while a unary answer is computed: if it leaves, the gRPC call is cancelled
at once instead of computing an answer nobody will read (streams get this from Starlette already)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")

# nginx's "client closed request": logged, never seen by the client that left.
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready."""


def client_left(request: Request) -> Response:
    """What a route returns for a client that left (nobody reads it; the logs and metrics do)."""
    request.app.state.metrics.disconnects.labels(request.url.path).inc()
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work`; raises ClientDisconnected (after cancelling `work`) if the client leaves first.

    `work` runs in the calling task and one watcher task cancels it if the client leaves (a task per
    side and asyncio.wait cost ~20 us more per request). Call only after the body was read: the next ASGI
    message is then the disconnect, if any.
    """
    current = asyncio.current_task()
    if current is None:
        raise RuntimeError("unless_disconnected runs inside a task")
    left = False

    async def watch() -> None:
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        current.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:
            raise
        current.uncancel()  # the cancellation was ours, not the caller's: balance it (asyncio.timeout)
        raise ClientDisconnected from None
    finally:
        watcher.cancel()
