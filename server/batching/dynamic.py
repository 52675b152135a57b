"""DynamicBatcher: gathers Infer items per bucket until max_batch_size or max_delay, then one forward pass.

Cancelled items are dropped before their batch forms and never computed. A batch that fails is split in
halves and retried, so one bad item fails alone; an out-of-memory error also trips the memory breaker.
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

from server.admission.breaker import MemoryBreaker
from server.batching.worker import ModelWorker
from server.domain import Array, InferItem, InferResult
from server.errors import DeadlineExpired, ModelFailure, OutOfMemory, SluiceError
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
    ) -> None:
        self.model = model
        self.worker = worker
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.breaker = breaker
        self._queues: dict[Hashable, deque[_Pending]] = {}
        self._wake = asyncio.Event()
        name = model.descriptor.name
        self._compute = metrics.compute.labels(name, "Infer")
        self._batch_size = metrics.batch_size.labels(name, "Infer")
        self._oom = metrics.oom.labels(name)
        self.items_computed = 0

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def submit(
        self, item: InferItem, deadline: float | None, *, admission_wait_s: float = 0.0
    ) -> InferResult:
        """Queues one validated item and waits for its slice of a batch; the result's queue wait counts
        the admission wait given here plus the time the batch took to form."""
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        key = self.model.bucket(item.inputs)
        self._queues.setdefault(key, deque()).append(
            _Pending(item.inputs, future, time.monotonic(), deadline, admission_wait_s)
        )
        self._wake.set()
        return await future  # a cancelled caller cancels the future; the batcher skips it

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (key := self._oldest_bucket()) is not None:
                queue = self._queues[key]
                wait = queue[0].enqueued + self.max_delay_s - time.monotonic()
                if len(queue) < self.max_batch_size and wait > 0:
                    with contextlib.suppress(TimeoutError):
                        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a shutdown cancel.
                        async with asyncio.timeout(wait):
                            await self._wake.wait()
                    self._wake.clear()
                    continue
                batch = self._take(queue)
                if batch:
                    await self._run_batch(batch)

    def _oldest_bucket(self) -> Hashable | None:
        for key in [k for k, q in self._queues.items() if not q]:
            del self._queues[key]
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
                pending.future.set_exception(
                    DeadlineExpired("the deadline passed while the request was queued")
                )
                continue
            batch.append(pending)
        return batch

    async def _run_batch(self, batch: list[_Pending]) -> None:
        start = time.monotonic()
        outcomes = await self.worker.run(self._forward_isolating, [p.inputs for p in batch])
        elapsed = time.monotonic() - start
        self.items_computed += len(batch)
        self._compute.observe(elapsed)
        self._batch_size.observe(len(batch))
        version = self.model.descriptor.version
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, SluiceError):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(
                    InferResult(
                        outcome,
                        version,
                        pending.admission_wait_s + start - pending.enqueued,
                        elapsed,
                        len(batch),
                    )
                )

    def _forward_isolating(self, items: Sequence[Mapping[str, Array]]) -> list[Outcome]:
        """Runs on the worker thread. Splits failing batches so each failure lands on its own item."""
        try:
            return list(self.model.forward(items))
        except torch.OutOfMemoryError as exc:
            self._recover_from_oom(exc)
            if len(items) == 1:
                return [OutOfMemory("out of memory running this request", retry_after_s=1.0)]
        except SluiceError as exc:
            if len(items) == 1:
                return [exc]
        except Exception as exc:
            if len(items) == 1:
                log.exception("model %s failed on one item", self.model.descriptor.name)
                return [ModelFailure(f"the model failed on this input: {type(exc).__name__}: {exc}")]
        half = len(items) // 2
        return self._forward_isolating(items[:half]) + self._forward_isolating(items[half:])

    def _recover_from_oom(self, exc: BaseException) -> None:
        self._oom.inc()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.breaker is not None:
            self.breaker.trip(f"out of memory in {self.model.descriptor.name}: {exc}")
