"""DynamicBatcher: gathers Infer items per bucket until max_batch_size or max_delay, then one forward pass.

While one batch computes, the next full batch is already handed to the worker thread, so the model does not
idle while the event loop answers the last batch and forms the next. Only a full batch is handed over
early; a partial one waits for the running batch, so pipelining never shrinks batches.

Cancelled items are never computed: the batch drops them when it forms and again on the worker thread the
moment its forward pass starts. A batch that fails is split in halves and retried, so one bad item fails
alone; an out-of-memory error also trips the memory breaker (server/batching/oom.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from server.batching.oom import OomRecovery, out_of_memory, release_cached_memory
from server.batching.switch_interval import ComputeInterval
from server.batching.worker import ModelWorker
from server.domain import Array, InferItem, InferResult
from server.errors import DeadlineExpired, ModelFailure, SluiceError
from server.memory.breaker import MemoryBreaker
from server.metrics import Metrics
from server.runtimes.base import TensorModel

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    inputs: Mapping[str, Array]
    future: asyncio.Future[InferResult]
    enqueued: float
    deadline: float | None
    admission_wait_s: float


Outcome = dict[str, Array] | SluiceError

#: Batches handed to the worker at once: the one computing and the next, full one, queued behind it.
PIPELINE_DEPTH = 2


@dataclass(frozen=True, slots=True)
class _Computed:
    """What the worker thread did with one batch: the items it computed, and when."""

    items: list[_Pending]
    outcomes: list[Outcome]
    expired: list[_Pending]
    started: float
    elapsed_s: float
    ooms: list[str]  # the out-of-memory errors met (the batch is split and retried after each)


class DynamicBatcher:
    def __init__(
        self,
        model: TensorModel,
        worker: ModelWorker,
        *,
        max_batch_size: int,
        max_delay_s: float,
        breaker: MemoryBreaker | None,
        metrics: Metrics,
        device_label: str = "",  # which device's replica, in the metrics (--devices); "": the model's device
        switch_interval_s: float | None = None,  # the GIL's while a batch computes (None: left as it is)
    ) -> None:
        self.model = model
        self.worker = worker
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self._queues: dict[Hashable, deque[_Pending]] = {}
        self._wake = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        name = model.descriptor.name
        self._compute = metrics.compute.labels(name, "Infer", device_label or model.descriptor.device)
        self._batch_size = metrics.batch_size.labels(name, "Infer", device_label or model.descriptor.device)
        self._interval: contextlib.AbstractContextManager[None] = (
            ComputeInterval(switch_interval_s) if switch_interval_s else contextlib.nullcontext()
        )
        self._oom = OomRecovery(name, breaker=breaker, counter=metrics.oom.labels(name))
        self.items_computed = 0
        # A model that keeps TensorModel's one bucket is not asked per call (a Python call per Infer).
        self._bucketed = type(model).bucket is not TensorModel.bucket

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def submit(
        self, item: InferItem, deadline: float | None, *, admission_wait_s: float = 0.0
    ) -> InferResult:
        """Queues one validated item and waits for its slice of a batch; the result's queue wait counts
        the admission wait given here plus the time the batch took to form."""
        return await self.enqueue(item, deadline, admission_wait_s=admission_wait_s)

    def enqueue(
        self, item: InferItem, deadline: float | None, *, admission_wait_s: float = 0.0
    ) -> asyncio.Future[InferResult]:
        """As submit, answering the future to await: the servicer's call awaits it without a coroutine of
        its own in between (two Python calls per Infer). Cancelling the future takes the item out."""
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        key = self.model.bucket(item.inputs) if self._bucketed else 0
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(_Pending(item.inputs, future, time.monotonic(), deadline, admission_wait_s))
        # The dispatcher decides on a bucket's first item (a batch to start forming) and as it fills (it may
        # go now); an item before or past that changes nothing until a batch ends, which wakes it anyway
        # (and it takes every full batch there is once awake). Waking it per item cost a task step per call.
        if len(queue) == 1 or len(queue) == self.max_batch_size:
            self._wake.set()
        return future  # a cancelled caller cancels the future; the batcher skips it

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._dispatch_ready()
        finally:
            for task in self._in_flight:
                task.cancel()

    async def _dispatch_ready(self) -> None:
        """Hands over every batch that may go now; returns when the rest must wait for a wake-up."""
        while (key := self._next_bucket()) is not None:
            queue = self._queues[key]
            if not self._in_flight and len(queue) < self.max_batch_size:
                wait = queue[0].enqueued + self.max_delay_s - time.monotonic()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a shutdown cancel.
                        async with asyncio.timeout(wait):
                            await self._wake.wait()
                    self._wake.clear()
                    continue
            batch = self._take(queue)
            if batch:
                self._dispatch(batch)

    def _next_bucket(self) -> Hashable | None:
        """The oldest bucket when the worker is idle; while it computes, a full bucket or None."""
        for key in [k for k, q in self._queues.items() if not q]:
            del self._queues[key]
        if not self._in_flight:
            return self._oldest_bucket()
        if len(self._in_flight) >= PIPELINE_DEPTH:
            return None
        full = [k for k, q in self._queues.items() if len(q) >= self.max_batch_size]
        return min(full, key=lambda k: self._queues[k][0].enqueued) if full else None

    def _dispatch(self, batch: list[_Pending]) -> None:
        task = asyncio.create_task(self._run_batch(batch))
        self._in_flight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._wake.set()  # a pipeline place is free: a partial batch may go now

    def _oldest_bucket(self) -> Hashable | None:
        if not self._queues:
            return None
        return min(self._queues, key=lambda k: self._queues[k][0].enqueued)

    def _take(self, queue: deque[_Pending]) -> list[_Pending]:
        batch: list[_Pending] = []
        now = time.monotonic()
        while queue and len(batch) < self.max_batch_size:
            pending = queue.popleft()
            if pending.future.done():
                continue  # cancelled while waiting: never computed
            if pending.deadline is not None and pending.deadline <= now:
                _expire(pending)
                continue
            batch.append(pending)
        return batch

    async def _run_batch(self, batch: list[_Pending]) -> None:
        try:
            done = await self.worker.run(self._compute_batch, batch)
        except Exception as exc:  # the worker itself failed (model errors are caught per item inside it)
            log.exception("the %s worker failed a batch", self.model.descriptor.name)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(ModelFailure(f"the model worker failed: {exc}"))
            return
        for why in done.ooms:
            self._oom.record(why)
        self.items_computed += len(done.items)
        if done.items:
            self._compute.observe(done.elapsed_s)
            self._batch_size.observe(len(done.items))
        for pending in done.expired:
            _expire(pending)
        version = self.model.descriptor.version
        for pending, outcome in zip(done.items, done.outcomes, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, SluiceError):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(
                    InferResult(
                        outcome,
                        version,
                        pending.admission_wait_s + done.started - pending.enqueued,
                        done.elapsed_s,
                        len(done.items),
                    )
                )

    def _compute_batch(self, batch: list[_Pending]) -> _Computed:
        """Runs on the worker thread. A pipelined batch may have waited behind the previous one, so the
        items cancelled or expired meanwhile are dropped here, as the forward pass starts."""
        started = time.monotonic()
        live: list[_Pending] = []
        expired: list[_Pending] = []
        for pending in batch:
            if pending.future.done():  # a plain read; cancellation itself happens on the loop
                continue
            if pending.deadline is not None and pending.deadline <= started:
                expired.append(pending)
            else:
                live.append(pending)
        ooms: list[str] = []
        outcomes: list[Outcome] = []
        if live:
            with self._interval:
                outcomes = self._forward_isolating([p.inputs for p in live], ooms)
        return _Computed(live, outcomes, expired, started, time.monotonic() - started, ooms)

    def _forward_isolating(self, items: Sequence[Mapping[str, Array]], ooms: list[str]) -> list[Outcome]:
        """Runs on the worker thread. Splits failing batches so each failure lands on its own item."""
        try:
            return list(self.model.forward(items))
        except torch.OutOfMemoryError as exc:
            release_cached_memory()
            ooms.append(str(exc))
            if len(items) == 1:
                return [out_of_memory("running this request")]
        except SluiceError as exc:
            if len(items) == 1:
                return [exc]
        except Exception as exc:
            if len(items) == 1:
                log.exception("model %s failed on one item", self.model.descriptor.name)
                return [ModelFailure(f"the model failed on this input: {type(exc).__name__}: {exc}")]
        half = len(items) // 2
        return self._forward_isolating(items[:half], ooms) + self._forward_isolating(items[half:], ooms)


def _expire(pending: _Pending) -> None:
    if not pending.future.done():
        pending.future.set_exception(DeadlineExpired("the deadline passed while the request was queued"))
