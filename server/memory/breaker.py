"""MemoryBreaker: opens above the high watermark, closes below the low one (hysteresis).

A background task samples the probe; requests only read a boolean. A caught out-of-memory error trips the
breaker at once, and it stays open until a sample falls below the low watermark.
"""

from __future__ import annotations

import asyncio
import logging

from server.errors import MemoryPressure
from server.memory.probes import MemoryProbe, MemoryReading

log = logging.getLogger(__name__)


class MemoryBreaker:
    def __init__(self, probe: MemoryProbe, *, high: float, low: float, interval_s: float) -> None:
        if not 0 < low < high <= 1:
            raise ValueError(f"invalid setting low_watermark: need 0 < low ({low}) < high ({high}) <= 1")
        self.probe = probe
        self.high = high
        self.low = low
        self.interval_s = interval_s
        self.is_open = False
        self.last = probe.read()
        self.trips = 0

    def sample(self) -> MemoryReading:
        reading = self.probe.read()
        self.last = reading
        if not self.is_open and reading.fraction >= self.high:
            self._set(True, f"memory at {reading.fraction:.1%} >= high watermark {self.high:.0%}")
        elif self.is_open and reading.fraction <= self.low:
            self._set(False, f"memory at {reading.fraction:.1%} <= low watermark {self.low:.0%}")
        return reading

    def trip(self, why: str) -> None:
        """Opens the breaker now (after a caught OOM); the next low sample closes it."""
        self.trips += 1
        if not self.is_open:
            self._set(True, why)

    def refusal(self) -> MemoryPressure:
        return MemoryPressure(
            f"memory pressure: {self.last.fraction:.1%} of the {self.probe.name} budget in use "
            f"(breaker opens at {self.high:.0%}, closes at {self.low:.0%})",
            metadata={"used_fraction": round(self.last.fraction, 4), "probe": self.probe.name},
            retry_after_s=max(self.interval_s * 4, 0.2),
        )

    async def run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a failing probe must not take the server down; keep the last state
                log.exception("memory probe failed")
            await asyncio.sleep(self.interval_s)

    def _set(self, is_open: bool, why: str) -> None:
        self.is_open = is_open
        log.warning("memory breaker %s: %s", "OPEN" if is_open else "closed", why)
