"""SchedulerGauges: what a Generate scheduler publishes - per iteration the sequences running and paused
and the KV arena's tokens (its fragmentation a few times a second: it walks every region), and per step
its compute time, batch size, tokens, the model thread's idle time before it and its compactions' copies."""

from __future__ import annotations

import time

from server.batching.memory import KvMemory
from server.batching.step import StepResult
from server.metrics import Metrics

_FRAGMENTATION_S = 0.25


class SchedulerGauges:
    def __init__(self, metrics: Metrics, name: str, device: str) -> None:
        self.stalled = metrics.stalled.labels(name)
        self._tokens = metrics.tokens.labels(name)
        self._active = metrics.sequences.labels(name)
        self._paused = metrics.sequences_paused.labels(name)
        self._kv = [
            g.labels(name)
            for g in (metrics.kv_slots, metrics.kv_tokens, metrics.kv_reserved, metrics.kv_cached,
                      metrics.kv_free, metrics.kv_shared)
        ]  # fmt: skip
        self._fragmentation = metrics.kv_fragmentation.labels(name)
        self._gap = metrics.step_gap.labels(name)
        self._compaction = metrics.kv_compaction.labels(name)
        self._compute = metrics.compute.labels(name, "Generate", device)
        self._batch = metrics.batch_size.labels(name, "Generate", device)
        self._fragmentation_at = 0.0
        self._last_finished = 0.0  # when the last decoding step ended on the model's thread (0: none)

    def sequences(self, active: int, runnable: int, memory: KvMemory) -> None:
        """At each iteration: `active` sequences hold memory, `runnable` of them decode next."""
        self._active.set(active)
        self._paused.set(active - runnable)
        arena = memory.arena
        free, shared = arena.free_tokens(), memory.shared
        values = (memory.holders, memory.written, arena.reserved(), arena.cached(), free, shared)
        for gauge, value in zip(self._kv, values, strict=True):
            gauge.set(value)
        now = time.monotonic()
        if now >= self._fragmentation_at + _FRAGMENTATION_S or not memory.holders:
            self._fragmentation_at = now
            self._fragmentation.set(arena.fragmentation())

    def step(self, result: StepResult, batch: int, *, decoding: bool) -> float:
        """A step that came back; returns its compute time. The gap is counted between decoding steps only:
        a step of prefill alone follows idle time, not the step before."""
        if self._last_finished and decoding:
            self._gap.observe(result.started - self._last_finished)
        self._last_finished = result.finished if decoding else 0.0
        for seconds in result.compactions:
            self._compaction.observe(seconds)
        took = result.finished - result.started
        self._compute.observe(took)
        self._batch.observe(batch)
        self._tokens.inc(len(result.tokens))
        return took

    def failed(self) -> None:
        """A step that failed as a whole: the next one's gap is not measured against it."""
        self._last_finished = 0.0
