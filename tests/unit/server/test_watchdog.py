"""WriteWatchdog: a stream whose current write began a timeout ago is ended: its slot given back once, its
handler task cancelled, and the STALLED_CONSUMER status queued; a stream between writes is left alone."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from server.admission.watchdog import WriteWatchdog

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Context:
    def __init__(self) -> None:
        self.aborted: list[tuple[grpc.StatusCode, str]] = []

    async def abort(self, code: grpc.StatusCode, details: str, trailing: Any) -> None:
        self.aborted.append((code, details))
        raise RuntimeError("abort raises, as grpc's does")


async def test_only_a_write_older_than_the_timeout_ends_its_stream() -> None:
    clock = Clock()
    stalled: list[str] = []
    watchdog = WriteWatchdog(timeout_s=2.0, on_stall=stalled.append, clock=clock)
    released: list[str] = []
    contexts = {name: Context() for name in ("stuck", "reading", "between")}
    started = asyncio.Event()

    async def handler(name: str, writing_since: float | None) -> None:
        stream = watchdog.watch(contexts[name], "byte-lm", lambda: released.append(name))  # type: ignore[arg-type]
        stream.writing_since = writing_since or 0.0
        started.set()
        await asyncio.Event().wait()  # blocked, as in grpc's write

    tasks = {
        "stuck": asyncio.create_task(handler("stuck", clock.now)),
        "reading": asyncio.create_task(handler("reading", clock.now + 1.5)),
        "between": asyncio.create_task(handler("between", None)),
    }
    await asyncio.sleep(0)
    clock.now += 2.0
    assert watchdog.sweep() == 1
    assert watchdog.sweep() == 0  # ended once
    await asyncio.sleep(0)
    assert released == ["stuck"] and stalled == ["byte-lm"]
    assert tasks["stuck"].cancelled() or tasks["stuck"].cancelling()
    assert not tasks["reading"].done() and not tasks["between"].done()
    await asyncio.gather(tasks["stuck"], return_exceptions=True)
    assert contexts["stuck"].aborted[0][0] == grpc.StatusCode.CANCELLED
    assert "accepted no data" in contexts["stuck"].aborted[0][1]
    assert watchdog.watched == 2
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
