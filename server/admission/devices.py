"""DeviceGates: one model's gates on several devices (`--devices`), which admission sees as one gate. A call
goes to the device with the least work in flight and waiting, then the most free memory; a device whose
memory breaker is open or whose gate is full takes none. The model is full only when every device is.

The device a call was admitted on travels in CHOSEN (the call's own task) to the servicer, which submits
to that device's batcher or scheduler, and its slot is that device's gate (`held_gate`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence

from server.admission.gate import AdmissionGate
from server.errors import Overloaded, SluiceError
from server.memory.breaker import MemoryBreaker
from server.priority import Priority

#: The index of the device the current call was admitted on (0 with one device).
CHOSEN: contextvars.ContextVar[int] = contextvars.ContextVar("device", default=0)


class _AllIdle:
    def __init__(self, gates: Sequence[AdmissionGate]) -> None:
        self._gates = gates

    async def wait(self) -> None:
        await asyncio.gather(*(gate.idle.wait() for gate in self._gates))


class DeviceGates:
    def __init__(self, name: str, gates: Sequence[AdmissionGate], breakers: Sequence[MemoryBreaker]) -> None:
        self.name = name
        self.gates = list(gates)
        self.breakers = list(breakers)
        self.idle = _AllIdle(self.gates)

    @property
    def slots(self) -> int:
        return sum(g.slots for g in self.gates)

    @property
    def max_waiting(self) -> int:
        return sum(g.max_waiting for g in self.gates)

    @property
    def in_use(self) -> int:
        return sum(g.in_use for g in self.gates)

    @property
    def waiting(self) -> int:
        return sum(g.waiting for g in self.gates)

    def _accepting(self) -> list[int]:
        return [i for i, g in enumerate(self.gates) if not self.breakers[i].is_open and not g.is_full()]

    def is_full(self) -> bool:
        return not self._accepting()

    def overloaded(self) -> SluiceError:
        if all(b.is_open for b in self.breakers):
            return self.breakers[0].refusal()
        return Overloaded(
            f"{self.name}: every device full ({self.in_use} running, {self.waiting} waiting)",
            metadata={"queue_depth": self.waiting, "max_queue": self.max_waiting, "in_flight": self.in_use},
            retry_after_s=min(g.retry_after_s() for g in self.gates),
        )

    def pick(self) -> int:
        """The least-loaded accepting device: work in flight and waiting, then free memory."""
        accepting = self._accepting() or list(range(len(self.gates)))

        def load(i: int) -> tuple[int, int]:
            reading = self.breakers[i].last
            return self.gates[i].in_use + self.gates[i].waiting, reading.used_bytes - reading.budget_bytes

        return min(accepting, key=load)

    async def acquire(self, priority: Priority, timeout_s: float | None, work: int = 0) -> float:
        index = self.pick()
        CHOSEN.set(index)
        return await self.gates[index].acquire(priority, timeout_s, work)

    def held_gate(self) -> AdmissionGate:
        """The gate of the device this call was admitted on (the one to release)."""
        return self.gates[CHOSEN.get()]
