"""FrontendPool: what the engine holds in place of a grpc.aio server when `--frontends N` > 1. It starts the
front-end processes on one shared port, takes their calls over one Unix socket each, runs every call
through the engine's interceptor and handlers (server/frontends/dispatch.py) and stops them on drain.

A front end that dies ends the engine (SIGTERM to itself, so it drains): a replica that some
connections can no longer reach is restarted whole by its supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import signal
import sys
from dataclasses import asdict
from typing import Any

from server.config import Settings
from server.frontends.arena import ArenaReader
from server.frontends.dispatch import CallDetails, Intercept, MethodTable, RemoteContext, run_call
from server.frontends.wire import (
    ACK,
    ARENA,
    CALL,
    CANCEL,
    FREED,
    LISTENING,
    SHUTDOWN,
    Body,
    RecordReader,
    take_body,
)

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class _Link:
    """One front end's connection: the calls it carries, by its call id."""

    def __init__(self, pool: FrontendPool) -> None:
        self.pool = pool
        self.calls: dict[int, tuple[asyncio.Task[None], RemoteContext]] = {}
        self.listening: asyncio.Future[tuple[int | None, str]] = asyncio.get_running_loop().create_future()
        self.reader = RecordReader(self.on_record, self.on_lost)
        self.arena: ArenaReader | None = None

    def on_record(self, record: tuple[Any, ...]) -> None:
        kind, call_id = record[0], record[1]
        if kind == CALL:
            _, _, method, metadata, deadline, body = record
            context = RemoteContext(call_id, CallDetails(method, metadata), deadline, self.reader.send)
            task = asyncio.create_task(
                run_call(self.pool.intercept, self.pool, context, self._take(body)), name=f"remote {method}"
            )
            self.calls[call_id] = (task, context)
            task.add_done_callback(functools.partial(self._ended, call_id))
        elif kind == ACK:
            found = self.calls.get(call_id)
            if found is not None:
                found[1].ack()
        elif kind == CANCEL:
            found = self.calls.get(call_id)
            if found is not None:
                found[0].cancel()
        elif kind == LISTENING and not self.listening.done():
            self.listening.set_result((record[2], record[3]))
        elif kind == ARENA:
            self.arena = ArenaReader(record[2])

    def _take(self, body: Body) -> bytes:
        """The body's bytes, copied out as the call arrives: its place in the arena is free at once."""
        if isinstance(body, tuple) and isinstance(body[0], int):
            assert self.arena is not None, "a front end sends its arena before its first call"
            data = self.arena.take((body[0], body[1]))
            self.reader.send((FREED, 0))
            return data
        return take_body(body)  # inline, or a segment of its own

    def _ended(self, call_id: int, _: asyncio.Task[None]) -> None:
        self.calls.pop(call_id, None)

    def on_lost(self, exc: Exception | None) -> None:
        self.cancel_all()
        if not self.listening.done():
            self.listening.set_result((None, "the front end closed its connection while starting"))
        if self in self.pool.links:
            self.pool.links.remove(self)
        if self.arena is not None:
            self.arena.close()

    def cancel_all(self) -> None:
        for task, _ in list(self.calls.values()):
            task.cancel()


class FrontendPool(MethodTable):
    """The engine's gRPC "server": N front-end processes and the calls they forward."""

    def __init__(self, settings: Settings, intercept: Intercept) -> None:
        super().__init__()
        self.settings = settings
        self.intercept = intercept
        self.links: list[_Link] = []
        self.processes: list[asyncio.subprocess.Process] = []
        # An abstract socket (Linux): nothing on disk to leave behind. Passed on without its leading NUL.
        self._name = f"sluice-engine-{os.getpid()}-{secrets.token_hex(4)}"
        self._server: asyncio.AbstractServer | None = None
        self._pending: asyncio.Queue[_Link] = asyncio.Queue()
        self._stopping = False
        self.failed = False  # a front end died: the engine drains and exits with an error
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self) -> int:
        """Starts the front ends, the first on --port and the others on the port it got; returns the port.
        Raises ValueError naming the port when it cannot be bound."""
        loop = asyncio.get_running_loop()

        def connected() -> RecordReader:
            link = _Link(self)
            self.links.append(link)
            self._pending.put_nowait(link)
            return link.reader

        self._server = await loop.create_unix_server(connected, "\0" + self._name)
        port = self.settings.port
        for index in range(self.settings.frontends):
            port = await self._spawn(index, port)
        return port

    async def _spawn(self, index: int, port: int) -> int:
        settings = json.dumps(asdict(self.settings) | {"port": port})
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "server.frontends.frontend", self._name, settings, str(os.getpid())
        )
        self.processes.append(process)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                link = await self._pending.get()
                bound, error = await link.listening
        except TimeoutError:
            bound, error = None, f"front end {index} did not start within {START_TIMEOUT_S:g} s"
        if bound is None:
            await self.stop(0)
            raise ValueError(error)
        self._watchers.append(asyncio.create_task(self._watch(index, process)))
        log.info("front end %d (pid %d) listening on port %d", index, process.pid, bound)
        return int(bound)

    async def _watch(self, index: int, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if not self._stopping:
            self.failed = True
            log.error("front end %d (pid %d) exited with %s: the server stops", index, process.pid, code)
            os.kill(os.getpid(), signal.SIGTERM)

    async def stop(self, grace: float | None) -> None:
        """As grpc.aio's Server.stop: calls get `grace` seconds to end, the rest are cancelled; then the
        front ends get what is left of it to deliver what they still hold (a slow reader's last messages
        and status), and are reaped."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        end = loop.time() + (grace or 0.0)
        calls = [task for link in self.links for task, _ in link.calls.values()]
        if calls and grace:
            await asyncio.wait(calls, timeout=grace)
        for link in self.links:
            link.cancel_all()
        await asyncio.sleep(0)  # let the cancelled calls send what they send
        left = max(end - loop.time(), 0.0)
        for link in list(self.links):
            link.reader.send((SHUTDOWN, 0, left))
        for process in self.processes:
            if process.returncode is None:
                try:
                    async with asyncio.timeout(max(end - loop.time(), 0.0) + STOP_TIMEOUT_S):
                        await process.wait()
                except TimeoutError:
                    process.kill()
                    await process.wait()
        for watcher in self._watchers:
            watcher.cancel()
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(Exception):
            if self._server is not None:
                await self._server.wait_closed()
