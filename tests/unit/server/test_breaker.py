"""MemoryBreaker: opens at the high watermark, closes only below the low one; a caught OOM trips it."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.memory.breaker import MemoryBreaker
from server.memory.probes import FakeProbe, HostProbe


def test_hysteresis(tmp_path: Path) -> None:
    level = tmp_path / "mem"
    breaker = MemoryBreaker(FakeProbe(level), high=0.9, low=0.7, interval_s=0.01)
    for value, is_open in [
        (0.5, False),
        (0.91, True),
        (0.8, True),
        (0.71, True),
        (0.69, False),
        (0.85, False),
    ]:
        level.write_text(str(value))
        breaker.sample()
        assert breaker.is_open is is_open, value
    refusal = breaker.refusal()
    assert refusal.code == "UNAVAILABLE" and refusal.reason == "MEMORY_PRESSURE" and refusal.retry_after_s


def test_trip_opens_until_memory_is_low(tmp_path: Path) -> None:
    level = tmp_path / "mem"
    level.write_text("0.8")
    breaker = MemoryBreaker(FakeProbe(level), high=0.9, low=0.7, interval_s=0.01)
    breaker.trip("oom")
    breaker.sample()
    assert breaker.is_open
    level.write_text("0.2")
    breaker.sample()
    assert not breaker.is_open and breaker.trips == 1


def test_host_probe_reads_this_process() -> None:
    reading = HostProbe(budget_bytes=1 << 40).read()
    assert 0 < reading.used_bytes < reading.budget_bytes and 0 < reading.fraction < 1


def test_watermarks_must_be_ordered(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="low_watermark"):
        MemoryBreaker(FakeProbe(tmp_path / "m"), high=0.5, low=0.6, interval_s=1)


def test_half_written_fake_file_keeps_the_breaker_open(tmp_path: Path) -> None:
    # The CI flake this guards: a writer truncates the file, the probe reads "", the breaker closed.
    level = tmp_path / "mem"
    level.write_text("0.95")
    breaker = MemoryBreaker(FakeProbe(level), high=0.9, low=0.7, interval_s=0.01)
    breaker.sample()
    assert breaker.is_open
    for partial in ["", "  \n", "0.9x"]:
        level.write_text(partial)
        breaker.sample()
        assert breaker.is_open, repr(partial)
    level.unlink()
    breaker.sample()
    assert not breaker.is_open, "a missing file reads as 0"
