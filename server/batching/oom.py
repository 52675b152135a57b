"""Out-of-memory recovery, one way for both batchers: on the model's thread the allocator's cached blocks go
back to the device (torch calls stay off the event loop); on the event loop the error is counted and the
memory breaker trips, so admission refuses new work until memory falls below the low watermark. Also what
the calls of a Generate step that failed as a whole end with."""

from __future__ import annotations

import logging

import torch
from prometheus_client import Counter

from server.errors import ModelFailure, OutOfMemory, SluiceError
from server.memory.breaker import MemoryBreaker

log = logging.getLogger(__name__)


def release_cached_memory() -> None:
    """Runs on the model's thread right after an out-of-memory error."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class OomRecovery:
    """The event-loop side: one per model."""

    def __init__(self, model: str, *, breaker: MemoryBreaker | None, counter: Counter) -> None:
        self.model = model
        self.breaker = breaker
        self._counter = counter

    def record(self, why: str) -> None:
        """Counts one out-of-memory error and trips the breaker."""
        self._counter.inc()
        if self.breaker is not None:
            self.breaker.trip(f"out of memory in {self.model}: {why}")


def out_of_memory(what: str) -> OutOfMemory:
    """The error the calls caught in an out-of-memory error end with."""
    return OutOfMemory(f"out of memory {what}", retry_after_s=1.0)


def step_failure(exc: Exception, oom: OomRecovery) -> SluiceError:
    """What the sequences of a failed step end with: out of memory counted (the worker gave the cached
    memory back already), a SluiceError as it is, anything else logged as a model failure."""
    if isinstance(exc, torch.OutOfMemoryError):
        oom.record(str(exc))
        return out_of_memory("during a decode step")
    if isinstance(exc, SluiceError):
        return exc
    log.exception("decode step failed", exc_info=exc)
    return ModelFailure(f"the decode step failed: {type(exc).__name__}: {exc}")
