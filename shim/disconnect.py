"""Watching the HTTP client while a unary answer is computed: if it leaves, the gRPC call is cancelled
at once instead of computing an answer nobody will read (streams get this from Starlette already)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

# nginx's "client closed request": logged, never seen by the client that left.
CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work`; raises ClientDisconnected (after cancelling `work`) if the client leaves first.

    Call only after the body was read: the next ASGI message is then the disconnect, if any.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise ClientDisconnected
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
