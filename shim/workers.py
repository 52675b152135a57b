"""`--workers N`: N shim processes serving one listening socket, each with its own event loop and pooled gRPC
channel, under a parent that only supervises (as uvicorn's and gunicorn's workers; vLLM's api-server-count).

The parent binds the socket (so `--port 0` reports one port for all), starts the workers with the spawn
method (a forked gRPC core is unusable in the child), prints the listening line once every worker has
started, restarts a worker that dies, and on SIGINT or SIGTERM passes SIGTERM on and waits out their
graceful shutdown. A worker dies with the parent, even a parent killed by SIGKILL. The workers' Prometheus
instruments live in files of one directory (prometheus_client's multiprocess mode, chosen by the
PROMETHEUS_MULTIPROC_DIR its workers inherit), so /metrics answered by any worker sums them all.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from prometheus_client import multiprocess

from shim.config import ShimSettings
from shim.serving import bind_socket, configure_logging, listening_line, serve

logger = logging.getLogger("shim.workers")

_PR_SET_PDEATHSIG = 1
# Beyond the workers' own graceful shutdown, the time they get to exit before SIGKILL.
_EXIT_MARGIN_S = 5.0


def _worker(settings: ShimSettings, sock: socket.socket, started: Connection, parent: int) -> None:
    """A worker process: dies with the parent, serves, tells the parent once it accepts connections."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        return
    configure_logging()
    serve(settings, sock, on_started=lambda: started.send(os.getpid()))


class _Worker:
    """One slot of the pool: its process, and the pipe on which it says it has started."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: BaseProcess | None = None
        self.started: Connection | None = None
        self.ready = False


class Supervisor:
    def __init__(self, settings: ShimSettings, sock: socket.socket) -> None:
        self._settings = settings
        self._sock = sock
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Worker(i) for i in range(settings.workers)]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.stopping: str | None = None

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def start(self, slot: _Worker) -> None:
        reader, writer = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_worker,
            args=(self._settings, self._sock, writer, os.getpid()),
            name=f"sluice-shim-worker-{slot.index}",
        )
        process.start()
        writer.close()
        slot.process, slot.started, slot.ready = process, reader, False

    def run(self, line: str) -> int:
        """Starts every worker, announces `line` once all have started, supervises until a signal; returns
        the exit code (1 when a worker cannot start)."""
        for slot in self._slots:
            self.start(slot)
        announced = False
        while self.stopping is None:
            by_handle: dict[Any, tuple[_Worker, str]] = {}
            for slot in self._slots:
                assert slot.process is not None and slot.started is not None
                by_handle[slot.process.sentinel] = (slot, "exited")
                if not slot.ready:
                    by_handle[slot.started] = (slot, "started")
            for handle in wait([*by_handle, self._wake_r.fileno()]):
                if handle == self._wake_r.fileno():
                    self._wake_r.recv(64)
                    continue
                slot, event = by_handle[handle]
                if event == "started" and self._started(slot):
                    continue
                if not self._exited(slot):
                    self.stop()
                    return 1
            if not announced and all(slot.ready for slot in self._slots):
                print(line, flush=True)
                announced = True
        logger.info("%s: stopping %d workers", self.stopping, len(self._slots))
        self.stop()
        return 0

    def _started(self, slot: _Worker) -> bool:
        assert slot.started is not None
        try:
            pid = slot.started.recv()
        except EOFError:
            return False  # it exited before starting; its sentinel says so
        slot.ready = True
        logger.info("worker %d serving (pid %d)", slot.index, pid)
        return True

    def _exited(self, slot: _Worker) -> bool:
        """Restarts a worker that died after it had started; False when it never started (its next try
        would fail the same way)."""
        assert slot.process is not None and slot.started is not None
        slot.process.join()
        multiprocess.mark_process_dead(slot.process.pid)  # type: ignore[no-untyped-call]
        slot.started.close()
        if self.stopping is not None:
            return True  # a Ctrl-C reaches the workers too: they stop, nothing to restart
        if not slot.ready:
            logger.error("worker %d exited with %s before serving", slot.index, slot.process.exitcode)
            return False
        logger.warning("worker %d exited with %s; starting another", slot.index, slot.process.exitcode)
        self.start(slot)
        return True

    def stop(self) -> None:
        processes = [slot.process for slot in self._slots if slot.process is not None]
        for process in processes:
            if process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid or 0, signal.SIGTERM)
        for process in processes:
            process.join(self._settings.graceful_shutdown_s + _EXIT_MARGIN_S)
            if process.exitcode is None:
                process.kill()
                process.join()


def supervise(settings: ShimSettings) -> int:
    """The parent of `settings.workers` shim processes; returns the exit code."""
    configure_logging()
    sock = bind_socket(settings.host, settings.port)
    metrics_dir = tempfile.mkdtemp(prefix="sluice-shim-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # inherited by the spawned workers
    supervisor = Supervisor(settings, sock)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, supervisor.on_signal)
    try:
        return supervisor.run(listening_line(settings, int(sock.getsockname()[1])))
    finally:
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
