"""DeviceGates: a call goes to the least-loaded device that accepts work; the model is full only when every
device is; a device whose breaker is open takes nothing; the admitted call releases its own device's gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from server.admission.devices import CHOSEN, DeviceGates
from server.admission.gate import AdmissionGate
from server.domain import Priority
from server.errors import MemoryPressure, Overloaded
from server.memory.breaker import MemoryBreaker
from server.memory.probes import FakeProbe


def devices(tmp_path: Path, count: int = 2, slots: int = 2, queue: int = 0) -> DeviceGates:
    gates = [AdmissionGate(f"g{i}", slots=slots, max_waiting=queue) for i in range(count)]
    breakers = [
        MemoryBreaker(FakeProbe(tmp_path / f"mem{i}"), high=0.9, low=0.7, interval_s=0.01)
        for i in range(count)
    ]
    return DeviceGates("Infer m", gates, breakers)


def test_calls_spread_to_the_least_loaded_device_and_release_their_own(tmp_path: Path) -> None:
    model = devices(tmp_path)

    async def scenario() -> list[int]:
        chosen = []
        for _ in range(4):
            await model.acquire(Priority.NORMAL, None)
            chosen.append(CHOSEN.get())
            assert model.held_gate() is model.gates[CHOSEN.get()]
        return chosen

    assert asyncio.run(scenario()) == [0, 1, 0, 1]
    assert model.is_full() and isinstance(model.overloaded(), Overloaded)
    model.gates[1].release(0.01)
    assert not model.is_full() and model.pick() == 1
    assert (model.slots, model.in_use) == (4, 3)


def test_a_device_with_its_breaker_open_takes_nothing(tmp_path: Path) -> None:
    model = devices(tmp_path)
    (tmp_path / "mem0").write_text("0.95")
    model.breakers[0].sample()
    assert model.breakers[0].is_open
    assert model.pick() == 1 and not model.is_full()
    (tmp_path / "mem1").write_text("0.95")
    model.breakers[1].sample()
    assert model.is_full() and isinstance(model.overloaded(), MemoryPressure)


def test_with_equal_work_the_device_with_more_free_memory_wins(tmp_path: Path) -> None:
    model = devices(tmp_path)
    (tmp_path / "mem0").write_text("0.6")
    (tmp_path / "mem1").write_text("0.2")
    for breaker in model.breakers:
        breaker.sample()
    assert model.pick() == 1


@pytest.mark.parametrize("count", [1, 3])
def test_idle_waits_for_every_device(tmp_path: Path, count: int) -> None:
    model = devices(tmp_path, count=count)

    async def scenario() -> None:
        await model.acquire(Priority.NORMAL, None)
        held = model.held_gate()
        waiting = asyncio.ensure_future(model.idle.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        held.release(0.01)
        await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())
