"""disconnect.py: `unless_disconnected` returns the work's result, or cancels the work and raises
ClientDisconnected when the client's next ASGI message is a disconnect; the watcher never outlives it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from starlette.requests import Request
from starlette.types import Message

from shim.upstream.disconnect import ClientDisconnected, unless_disconnected

pytestmark = pytest.mark.anyio


class Client:
    """The ASGI receive channel of one request: messages arrive when the test sends them."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        self.waiting = 0

    async def receive(self) -> Message:
        self.waiting += 1
        try:
            message = await self.messages.get()
            self.messages.task_done()
            return message
        finally:
            self.waiting -= 1

    def request(self) -> Request:
        return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, self.receive)


def blocked() -> tuple[asyncio.Event, Callable[[], Awaitable[str]], list[str]]:
    """Work that finishes when released and records whether it was cancelled."""
    release = asyncio.Event()
    seen: list[str] = []

    async def work() -> str:
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "answer"

    return release, work, seen


async def test_the_result_is_returned_and_the_watcher_stops() -> None:
    client = Client()
    release, work, seen = blocked()
    task = asyncio.create_task(unless_disconnected(client.request(), work()))
    await asyncio.sleep(0)
    release.set()
    assert await task == "answer"
    assert seen == []
    await asyncio.sleep(0)  # let the cancelled watcher unwind
    assert client.waiting == 0


async def test_a_disconnect_cancels_the_work_and_raises() -> None:
    client = Client()
    _, work, seen = blocked()
    task = asyncio.create_task(unless_disconnected(client.request(), work()))
    await client.messages.put({"type": "http.disconnect"})
    with pytest.raises(ClientDisconnected):
        await task
    await asyncio.sleep(0)
    assert seen == ["cancelled"]


async def test_other_messages_are_not_a_disconnect() -> None:
    client = Client()
    release, work, seen = blocked()
    task = asyncio.create_task(unless_disconnected(client.request(), work()))
    await client.messages.put({"type": "http.request", "body": b"", "more_body": False})
    await client.messages.put({"type": "http.request", "body": b"", "more_body": False})
    await client.messages.join()  # both taken by the watcher, which keeps watching
    assert not task.done()
    release.set()
    assert await task == "answer"
    assert seen == []


async def test_a_failure_of_the_work_propagates_as_itself() -> None:
    client = Client()

    async def failing() -> str:
        raise LookupError("upstream said no")

    with pytest.raises(LookupError, match="upstream said no"):
        await unless_disconnected(client.request(), failing())
    await asyncio.sleep(0)
    assert client.waiting == 0


async def test_cancelling_the_caller_cancels_the_work_too() -> None:
    client = Client()
    _, work, seen = blocked()
    task = asyncio.create_task(unless_disconnected(client.request(), work()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert seen == ["cancelled"]
    assert client.waiting == 0
