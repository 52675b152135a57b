"""ModelWorker: the one thread a model's torch code runs on, so the event loop never blocks on torch.

Results go back to the event loop through a second, tiny thread: waking the loop is a system call, during
which the loop's thread would take the GIL and run its Python (delivery, planning) while the model's
thread waits to start the next step. Where the next job is already queued, a result is held until that
job calls `flush` (a step does, once its inputs are built and its torch work begins) or ends, so one step
follows the other without that wait (issue 19, point 4).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

import torch

P = ParamSpec("P")
T = TypeVar("T")

_Job = tuple[Callable[[], Any], Future[Any], bool] | None


class ModelWorker:
    """One thread per model: torch already uses every core per op, so more threads only contend."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[Future[Any], bool, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"model-{name}", daemon=True)
        self._notifier = threading.Thread(target=self._notify, name=f"model-{name}-results", daemon=True)
        self._held: list[tuple[Future[Any], bool, Any]] = []  # results held for the next job's flush
        self._thread.start()
        self._notifier.start()
        self._closed = False

    def flush(self) -> None:
        """Releases held results (called on the worker thread, by the job that follows them)."""
        while self._held:
            self._done.put(self._held.pop(0))

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Queues fn on the worker thread now (not when a task first runs)."""
        return asyncio.wrap_future(self._put(functools.partial(fn, *args, **kwargs), False))

    def submit_flushing(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """As submit, for an fn that calls `flush` early: the result of the job before it may wait for
        that, so a step handed over while the one before computes starts the moment that one ends."""
        return asyncio.wrap_future(self._put(functools.partial(fn, *args, **kwargs), True))

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.submit(fn, *args, **kwargs)

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs fn on the worker thread and waits (start-up only: loading, warm-up, measurement)."""
        return self._put(functools.partial(fn, *args, **kwargs), False).result()

    def shutdown(self) -> None:
        """Cancels what has not started, waits for what has."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join()
        self._done.put(None)
        self._notifier.join()

    def _put(self, job: Callable[[], T], flushes: bool) -> Future[T]:
        if self._closed:
            raise RuntimeError("the model worker is shut down")
        future: Future[T] = Future()
        self._jobs.put((job, future, flushes))
        return future

    def _serve(self) -> None:
        with torch.inference_mode():  # once for the thread: entering it per job cost part of the step gap
            self._serve_jobs()

    def _serve_jobs(self) -> None:
        item = self._jobs.get()
        while item is not None:
            job, future, _ = item
            if future.set_running_or_notify_cancel():
                try:
                    outcome: tuple[Future[Any], bool, Any] = (future, True, job())
                except BaseException as exc:  # handed to whoever awaits the job
                    outcome = (future, False, exc)
                self.flush()  # whatever the job did not
                self._held.append(outcome)
            if self._jobs.empty():
                self.flush()  # never held while the thread waits
                item = self._jobs.get()
            else:
                item = self._jobs.get_nowait()
                if item is None or not item[2]:
                    self.flush()  # only a job that flushes early may hold its predecessor's result
        self.flush()
        while not self._jobs.empty():  # shut down: what never started is cancelled
            if (left := self._jobs.get()) is not None:
                left[1].cancel()

    def _notify(self) -> None:
        while (outcome := self._done.get()) is not None:
            future, ok, value = outcome
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
