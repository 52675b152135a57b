"""AdmissionGate: N slots, at most Q waiters, waiters served by priority with ageing.

Ageing is a static key: a waiter's key is its arrival time minus `priority * ageing_s`, so a HIGH request
overtakes LOW ones that arrived up to 2 * ageing_s before it, and nothing waits behind newer arrivals forever.

The drain rate behind deadline estimates is learnt only while callers queue: the gap between two releases
that each handed their slot to a waiter. Gaps that include idle time say nothing about how fast a queue
drains (after a minute of quiet they made the first calls of a burst look unmeetable).

A call's own service time is either the EWMA of how long calls held their slot (Infer), or, for a gate
given `service_of` (Generate), what the scheduler says that much work takes at its measured decode rate:
how long earlier streams' readers took, or how long a stalled peer kept a stream, is not a property of the
model, so a Generate gate learns nothing from hold times. (Learning Infer's only from successful calls
was tried: in the cancellation storm test the estimate then stayed near zero, 2 ms-deadline calls were
let in, and Infer callers stopped queueing: 21-45 admitted instead of 78.) While the gate is idle the
service estimate decays, halving every second: an estimate that refused every call would otherwise
never be corrected, since only calls that run teach it. (Letting any call through an idle gate, as a
probe, was tried first: the storm test then saw Infer callers stop queueing now and then.)
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from server.errors import DeadlineExpired, DeadlineUnmeetable, Overloaded
from server.priority import Priority

_EWMA = 0.1
_IDLE_HALF_LIFE_S = 1.0


@dataclass(order=True, slots=True)
class _Waiter:
    key: float
    seq: int
    future: asyncio.Future[None] = field(compare=False)


class AdmissionGate:
    """A priority semaphore with a bounded wait queue; every acquire is paired with exactly one release."""

    def __init__(
        self,
        name: str,
        *,
        slots: int,
        max_waiting: int,
        ageing_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        service_of: Callable[[int], float] | None = None,
    ) -> None:
        if slots <= 0:
            raise ValueError(f"invalid setting max_concurrency for {name}: must be > 0, got {slots}")
        if max_waiting < 0:
            raise ValueError(f"invalid setting max_queue for {name}: must be >= 0, got {max_waiting}")
        self.name = name
        self.slots = slots
        self.max_waiting = max_waiting
        self.ageing_s = ageing_s
        self.in_use = 0
        self.waiting = 0
        self.idle = asyncio.Event()  # set while no slot is held: what a drain waits for
        self.idle.set()
        self._heap: list[_Waiter] = []
        self._counter = itertools.count()
        self._clock = clock
        self._service_of = service_of  # seconds a call asking for that much work takes (None: learnt)
        self._service_s = 0.0  # EWMA of how long a successful call holds its slot
        self._last_handover: float | None = None  # the last release that passed its slot to a waiter
        self._idle_since: float | None = None  # when the last slot came back (cleared once one is taken)
        self._release_interval_s = 0.0  # EWMA of the time between releases while queued: 1 / drain rate

    def is_full(self) -> bool:
        """True when a new call would be refused: every slot held and the wait queue at its bound."""
        return self.in_use >= self.slots and self.waiting >= self.max_waiting

    def _drain_interval_s(self) -> float:
        """Seconds between slots coming free under load: measured while queued, else N slots held S each."""
        return self._release_interval_s or self._service_s / self.slots

    def retry_after_s(self) -> float:
        """A retry hint from the drain rate: roughly when the current queue will have drained."""
        interval = self._drain_interval_s() or 0.05
        return min(max((self.waiting + 1) * interval, 0.01), 5.0)

    def estimated_wait_s(self, work: int = 0) -> float:
        """Expected time from arrival to completion for a new call asking for `work` (Generate: tokens), from
        measured rates (0 when unknown)."""
        ahead = self.waiting + 1 if self.in_use >= self.slots else 0
        service = self._service_of(work) if self._service_of is not None else self._service_s
        if self.in_use == 0 and self._idle_since is not None:
            service *= 0.5 ** ((self._clock() - self._idle_since) / _IDLE_HALF_LIFE_S)
        return ahead * self._drain_interval_s() + service

    def overloaded(self) -> Overloaded:
        return Overloaded(
            f"{self.name}: {self.in_use} running and {self.waiting} waiting (queue bound {self.max_waiting})",
            metadata={"queue_depth": self.waiting, "max_queue": self.max_waiting, "in_flight": self.in_use},
            retry_after_s=self.retry_after_s(),
        )

    async def acquire(self, priority: Priority, timeout_s: float | None, work: int = 0) -> float:
        """Waits for a slot; returns the time spent waiting. Raises Overloaded / Deadline* when refused."""
        if timeout_s is not None:
            if timeout_s <= 0:
                raise DeadlineExpired("the deadline passed before the request was admitted")
            estimate = self.estimated_wait_s(work)
            if estimate and timeout_s < estimate:
                raise DeadlineUnmeetable(
                    f"deadline in {timeout_s * 1000:.0f} ms but the estimated wait plus service time is "
                    f"{estimate * 1000:.0f} ms",
                    metadata={"timeout_ms": round(timeout_s * 1000), "estimate_ms": round(estimate * 1000)},
                    retry_after_s=self.retry_after_s(),
                )
        # A free slot means no live waiter (release hands slots to waiters first). `waiting` may still count
        # a waiter whose task was cancelled but has not run yet: queueing behind it would wait forever.
        if self.in_use < self.slots:
            self.in_use += 1
            self.idle.clear()
            self._idle_since = None
            return 0.0
        if self.waiting >= self.max_waiting:
            raise self.overloaded()
        start = self._clock()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._heap, _Waiter(start - int(priority) * self.ageing_s, next(self._counter), future)
        )
        self.waiting += 1
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that lands after the slot
            # was handed over, admitting a caller who has already gone.
            async with asyncio.timeout(timeout_s):
                await future
        except TimeoutError:
            self._forget(future)
            raise DeadlineExpired("the deadline passed while the request waited for a slot") from None
        except asyncio.CancelledError:
            self._forget(future)
            raise
        return self._clock() - start

    def held_gate(self) -> AdmissionGate:
        """The gate an admitted call holds and releases: this one (DeviceGates answers one of its own)."""
        return self

    def release(self, held_s: float) -> None:
        now = self._clock()
        if self._service_of is None:
            self._service_s += _EWMA * (held_s - self._service_s) if self._service_s else held_s
        while self._heap:
            waiter = heapq.heappop(self._heap)
            if not waiter.future.done():
                self.waiting -= 1
                waiter.future.set_result(None)  # the slot passes straight to the waiter
                self._learn_drain(now)
                return
        self._last_handover = None  # the queue is empty: the next gap would include idle time
        self.in_use -= 1
        if self.in_use == 0:
            self.idle.set()
            self._idle_since = now

    def _learn_drain(self, now: float) -> None:
        """Counts the gap since the previous hand-over: both ends had a queue, so no idle time is in it."""
        if self._last_handover is not None:
            gap = now - self._last_handover
            first = not self._release_interval_s
            self._release_interval_s = (
                gap if first else self._release_interval_s + _EWMA * (gap - self._release_interval_s)
            )
        self._last_handover = now

    def _forget(self, future: asyncio.Future[None]) -> None:
        """Undoes a wait that ended without a slot; if the slot arrived meanwhile, hands it on."""
        if future.done() and not future.cancelled():
            self.release(self._service_s)
            return
        future.cancel()
        self.waiting -= 1
        # Cancelled waiters stay in the heap and are skipped by release(); prune when they dominate.
        if len(self._heap) > 2 * self.waiting + 16:
            self._heap = [w for w in self._heap if not w.future.done()]
            heapq.heapify(self._heap)
