"""The server under the storms: the flags it runs with, the counters and gauges read from it, and waiting
on them (never a fixed sleep)."""

from __future__ import annotations

from bench.stack import SluiceServer
from launcher.services import wait_until

MODEL = "byte-lm"


def storm_server_flags(*, max_sequences: int, context_length: int, stall_timeout_s: float) -> list[str]:
    return [
        "--models",
        MODEL,
        "--max-sequences",
        str(max_sequences),
        "--max-queue",
        str(max_sequences),
        "--context-length",
        str(context_length),
        "--stall-timeout-s",
        str(stall_timeout_s),
        # One intra-op thread: on a 2-core machine shared with the clients, torch's spinning OpenMP
        # threads slow every step many times over (30 x 200 tokens: ~5 s with the default, <1 s with 1).
        "--torch-threads",
        "1",
        # The first engine's slot cache in bytes (the byte LM takes 1 KiB a token): the storms hold memory
        # as they did, and the cached prefixes cannot grow the resident set past it.
        "--kv-cache-bytes",
        str(max_sequences * context_length * 1024),
        # Resident from the start, as the first engine's slot cache was: the RSS growth the storms report
        # is then what they leave behind, not the arena's pages written for the first time.
        "--kv-cache-prefault",
        "true",
    ]


def counter(server: SluiceServer, name: str) -> float:
    return server.metric(name, model=MODEL)


def wait_idle(server: SluiceServer, timeout: float = 60.0) -> dict[str, float]:
    """Waits until no sequence, KV slot or Generate call is held; returns those gauges."""
    gauges = {
        "sluice_kv_slots_in_use": {"model": MODEL},
        "sluice_sequences_active": {"model": MODEL},
        "sluice_requests_in_flight": {"method": "Generate"},
    }
    values: dict[str, float] = {}

    def idle() -> bool:
        values.update({name: server.metric(name, **labels) for name, labels in gauges.items()})
        return not any(values.values())

    wait_until(idle, timeout=timeout, what=f"an idle server (last seen {values})")
    return values
