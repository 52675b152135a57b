"""AdmissionGate: slot accounting, the queue bound, priority with ageing, cancellation and deadlines."""

from __future__ import annotations

import asyncio

import pytest

from server.admission.gate import AdmissionGate
from server.domain import Priority
from server.errors import DeadlineExpired, DeadlineUnmeetable, Overloaded


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_refuses_beyond_slots_plus_queue() -> None:
    async def main() -> None:
        gate = AdmissionGate("t", slots=2, max_waiting=1)
        await gate.acquire(Priority.NORMAL, None)
        await gate.acquire(Priority.NORMAL, None)
        waiter = asyncio.create_task(gate.acquire(Priority.NORMAL, None))
        await asyncio.sleep(0)
        assert (gate.in_use, gate.waiting, gate.is_full()) == (2, 1, True)
        with pytest.raises(Overloaded) as info:
            await gate.acquire(Priority.NORMAL, None)
        assert info.value.metadata["queue_depth"] == "1" and info.value.retry_after_s is not None
        gate.release(0.01)
        await waiter
        assert (gate.in_use, gate.waiting) == (2, 0)
        gate.release(0.01)
        gate.release(0.01)
        assert gate.in_use == 0 and gate.idle.is_set()

    run(main())


def test_priority_first_but_ageing_prevents_starvation() -> None:
    async def main() -> list[str]:
        gate = AdmissionGate("t", slots=1, max_waiting=10, ageing_s=0.5)
        await gate.acquire(Priority.NORMAL, None)
        order: list[str] = []
        loop = asyncio.get_running_loop()

        async def waiter(name: str, priority: Priority) -> None:
            await gate.acquire(priority, None)
            order.append(name)

        # An old LOW request: its key is 1.5 s older than a fresh HIGH one's advantage (2 x 0.5 s) can beat.
        low = asyncio.create_task(waiter("old-low", Priority.LOW))
        await asyncio.sleep(0)
        gate._heap[0].key -= 1.5  # it has waited 1.5 s
        tasks = [
            low,
            loop.create_task(waiter("normal", Priority.NORMAL)),
            loop.create_task(waiter("high", Priority.HIGH)),
        ]
        await asyncio.sleep(0)
        for _ in range(3):
            gate.release(0.01)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert run(main()) == ["old-low", "high", "normal"]


def test_high_priority_overtakes_fresh_normal() -> None:
    async def main() -> list[str]:
        gate = AdmissionGate("t", slots=1, max_waiting=10)
        await gate.acquire(Priority.NORMAL, None)
        order: list[str] = []

        async def waiter(name: str, priority: Priority) -> None:
            await gate.acquire(priority, None)
            order.append(name)
            gate.release(0.0)

        tasks = [
            asyncio.create_task(waiter(n, p))
            for n, p in [("low", Priority.LOW), ("normal", Priority.NORMAL), ("high", Priority.HIGH)]
        ]
        await asyncio.sleep(0)
        gate.release(0.0)
        await asyncio.gather(*tasks)
        return order

    assert run(main()) == ["high", "normal", "low"]


def test_cancelled_waiter_frees_its_queue_place_and_never_gets_a_slot() -> None:
    async def main() -> None:
        gate = AdmissionGate("t", slots=1, max_waiting=1)
        await gate.acquire(Priority.NORMAL, None)
        waiter = asyncio.create_task(gate.acquire(Priority.NORMAL, None))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.waiting == 0
        gate.release(0.01)
        assert gate.in_use == 0

    run(main())


def test_deadline_expires_while_waiting() -> None:
    async def main() -> None:
        gate = AdmissionGate("t", slots=1, max_waiting=4)
        await gate.acquire(Priority.NORMAL, None)
        with pytest.raises(DeadlineExpired):
            await gate.acquire(Priority.NORMAL, 0.01)
        assert (gate.in_use, gate.waiting) == (1, 0)
        with pytest.raises(DeadlineExpired):
            await gate.acquire(Priority.NORMAL, 0.0)

    run(main())


def test_unmeetable_deadline_is_refused_up_front() -> None:
    async def main() -> None:
        gate = AdmissionGate("t", slots=1, max_waiting=4)
        await gate.acquire(Priority.NORMAL, None)
        gate.release(0.5)  # teaches the gate that a call holds its slot for 0.5 s
        await gate.acquire(Priority.NORMAL, None)
        with pytest.raises(DeadlineUnmeetable) as info:
            await gate.acquire(Priority.NORMAL, 0.1)
        assert gate.waiting == 0 and info.value.retry_after_s is not None

    run(main())


def test_an_idle_gate_forgets_its_estimate() -> None:
    """Only calls that run teach the estimate, so one that refused every call would never be corrected:
    while nothing is in flight it halves every second."""

    async def main() -> None:
        clock = FakeClock()
        gate = AdmissionGate("t", slots=2, max_waiting=4, clock=clock)
        await gate.acquire(Priority.NORMAL, None)
        gate.release(20.0)  # a 20 s call, and the gate is idle
        with pytest.raises(DeadlineUnmeetable):
            await gate.acquire(Priority.NORMAL, 3.0)
        clock.now += 3.0  # 20 s / 2**3 = 2.5 s
        await gate.acquire(Priority.NORMAL, 3.0)
        assert gate.estimated_wait_s() == pytest.approx(20.0)  # busy again: no more decay
        gate.release(0.01)  # that call came back fast: the estimate moves down
        assert gate.estimated_wait_s() < 20.0

    run(main())


def test_a_gate_with_a_service_model_estimates_by_the_work_asked() -> None:
    """Generate's gates ask the scheduler (tokens x the measured step time) instead of learning how long
    slots were held."""

    async def main() -> None:
        gate = AdmissionGate("t", slots=4, max_waiting=4, service_of=lambda tokens: tokens * 0.01)
        await gate.acquire(Priority.NORMAL, None)
        gate.release(60.0)  # a slow reader's stream: not a service time for this gate
        await gate.acquire(Priority.NORMAL, None)
        await gate.acquire(Priority.NORMAL, 3.0, 2)  # 2 tokens: 20 ms
        with pytest.raises(DeadlineUnmeetable) as info:
            await gate.acquire(Priority.NORMAL, 3.0, 1000)  # 1,000 tokens: 10 s
        assert info.value.metadata["estimate_ms"] == "10000"

    run(main())


def test_bad_settings_name_the_setting() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        AdmissionGate("t", slots=0, max_waiting=1)
    with pytest.raises(ValueError, match="max_queue"):
        AdmissionGate("t", slots=1, max_waiting=-1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_time_never_counts_as_drain_time() -> None:
    """After a minute with no traffic, a burst of calls with 30 s deadlines is queued, not refused: the
    drain rate is learnt only between releases that hand a slot to a waiter."""

    async def main() -> None:
        clock = FakeClock()
        gate = AdmissionGate("t", slots=2, max_waiting=64, clock=clock)

        async def queue_behind(count: int, timeout_s: float | None) -> list[asyncio.Task[float]]:
            tasks = [asyncio.create_task(gate.acquire(Priority.NORMAL, timeout_s)) for _ in range(count)]
            await asyncio.sleep(0)
            return tasks

        # A busy period: a queue drains by one slot every 10 ms.
        await gate.acquire(Priority.NORMAL, None)
        await gate.acquire(Priority.NORMAL, None)
        waiters = await queue_behind(20, None)
        for _ in range(20):
            clock.now += 0.01
            gate.release(0.02)
        await asyncio.gather(*waiters)
        assert gate._release_interval_s == pytest.approx(0.01)
        clock.now += 0.01
        gate.release(0.02)
        gate.release(0.02)
        assert gate.in_use == 0
        # A minute of quiet, then a burst that queues.
        clock.now += 60.0
        await gate.acquire(Priority.NORMAL, None)
        await gate.acquire(Priority.NORMAL, None)
        burst = await queue_behind(30, 30.0)
        clock.now += 0.01
        gate.release(0.02)  # the first hand-over after the quiet minute
        late = await queue_behind(10, 30.0)
        assert gate.estimated_wait_s() < 1.0, gate.estimated_wait_s()
        assert not any(t.done() for t in late), [t.exception() for t in late if t.done()]
        for task in [*burst, *late]:
            task.cancel()
        await asyncio.gather(*burst, *late, return_exceptions=True)

    run(main())
