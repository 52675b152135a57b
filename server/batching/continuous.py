"""ContinuousScheduler: iteration-level batching for Generate.

Each iteration is a step boundary: finished, cancelled and stalled sequences leave and give their KV region
up (to the prefix cache); waiting sequences join in admission's order, taking a region sized to their
prompt and max_tokens and any cached prefix (KvMemory, which may preempt lower-priority sequences: they
rejoin and are recomputed); then one decode step runs over every sequence whose consumer has room.
Paused sequences keep their cache and rejoin when their consumer catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import llguidance
import torch

from server.batching.delivery import Delivery, finish
from server.batching.lookahead import Inflight, next_position, pending
from server.batching.memory import KvMemory
from server.batching.oom import OomRecovery, out_of_memory
from server.batching.prefill import plan_prefill
from server.batching.requests import RequestLimits, resolve_request
from server.batching.sequence import GenSequence
from server.batching.shaping import OutputShaping
from server.batching.step import StepChain, StepPlan, run_step
from server.batching.stream import TokenStream, merge
from server.batching.text import TextAssembler
from server.batching.worker import ModelWorker
from server.domain import (
    FinishReason,
    GenerateSpec,
    TokenChunk,
)
from server.errors import (
    ModelFailure,
    ShuttingDown,
    SluiceError,
    StalledConsumer,
)
from server.memory.breaker import MemoryBreaker
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel

log = logging.getLogger(__name__)
_STEP_EWMA = 0.05
_KV_GAUGES_S = 0.25


def _released(seq: GenSequence) -> None:
    """Tells the sequence's owner (admission) its KV slot is free; once."""
    if seq.on_release is not None:
        release, seq.on_release = seq.on_release, None
        release()


class ContinuousScheduler:
    def __init__(
        self,
        model: GenerativeModel,
        worker: ModelWorker,
        *,
        kv_tokens: int,
        limits: RequestLimits,
        stream_buffer: int,
        stall_timeout_s: float,
        breaker: MemoryBreaker | None,
        metrics: Metrics,
        prefill_chunk_tokens: int | None = None,
        prefix_cache: bool = True,
        device_label: str = "",  # which device's replica, in the metrics (--devices); "": the model's device
    ) -> None:
        self.model = model
        self.worker = worker
        name = model.descriptor.name
        self.memory = KvMemory(kv_tokens, prefix_cache=prefix_cache, metrics=metrics, model=name)
        self.limits = limits
        self.stream_buffer = stream_buffer
        self.stall_timeout_s = stall_timeout_s
        # None: whole prompts (a runtime that cannot prefill from mid-prompt), as many as slots allow.
        self.prefill_chunk = prefill_chunk_tokens if model.chunked_prefill else None
        self.joining: deque[GenSequence] = deque()
        self.active: list[GenSequence] = []
        self.steps_started = 0
        self.step_s = 0.0  # EWMA of a step's duration: what one more token of a stream costs now
        self.drain_deadline: float | None = None
        self._last_finished = 0.0
        self._chain = StepChain(worker.flush)
        self._kv_published = 0.0
        self.delivery = Delivery(model, limits.context_length, metrics)
        self.shaping = OutputShaping(model)
        self._wake = asyncio.Event()
        self._m_tokens = metrics.tokens.labels(name)
        self._m_active = metrics.sequences.labels(name)
        self._m_paused = metrics.sequences_paused.labels(name)
        self._m_stalled = metrics.stalled.labels(name)
        self._m_kv = [
            g.labels(name)
            for g in (metrics.kv_slots, metrics.kv_tokens, metrics.kv_reserved, metrics.kv_cached,
                      metrics.kv_free)
        ]  # fmt: skip
        self._m_gap = metrics.step_gap.labels(name)
        self._m_fragmentation = metrics.kv_fragmentation.labels(name)
        self._m_compute = metrics.compute.labels(name, "Generate", device_label or model.descriptor.device)
        self._m_batch = metrics.batch_size.labels(name, "Generate", device_label or model.descriptor.device)
        self._oom = OomRecovery(name, breaker=breaker, counter=metrics.oom.labels(name))

    # -- the request side (event loop) ------------------------------------------------------------
    def service_estimate_s(self, max_tokens: int) -> float:
        """How long a stream asking for `max_tokens` (0: the default) takes at the measured step rate; 0
        before the first step. Admission's deadline estimate for Generate: a stream's service depends on
        its length and the decode rate, not on how fast earlier streams were read."""
        tokens = min(max_tokens or self.limits.default_max_tokens, self.limits.context_length)
        return tokens * self.step_s

    async def prepare(self, spec: GenerateSpec) -> llguidance.LLMatcher | None:
        """The spec's constraint compiled off the event loop (None without one); pass it to submit."""
        return await self.shaping.prepare(spec)

    def submit(
        self,
        spec: GenerateSpec,
        *,
        on_release: Callable[[], None] | None = None,
        deadline: float | None = None,
        salt: str = "",
        matcher: llguidance.LLMatcher | None = None,
        admission_wait_s: float = 0.0,
    ) -> GenSequence:
        """Validates against the model's limits (raising before the stream starts) and queues to join.
        `on_release` is called once the sequence has left and given its KV region up; `deadline`
        (monotonic) and the spec's priority rank it for memory; `salt` scopes its prefix cache;
        `admission_wait_s`, the wait for its slot, counts in its timings."""
        prompt, params = resolve_request(spec, self.model, self.limits)
        seed = spec.sampling.seed if spec.sampling.seed is not None else secrets.randbits(63)
        seq = GenSequence(
            prompt,
            params,
            seed,
            TokenStream(self.stream_buffer, self._wake.set),
            TextAssembler(params.stop, strip_leading_space=self.model.strips_leading_space),
            time.monotonic(),
            priority=spec.priority,
            deadline=math.inf if deadline is None else deadline,
            salt=salt,
            feed=list(prompt),
            on_release=on_release,
            admission_wait_s=admission_wait_s,
        )
        self.shaping.attach(seq, spec, matcher)
        self.joining.append(seq)
        self._wake.set()
        return seq

    async def chunks(self, seq: GenSequence) -> AsyncIterator[TokenChunk]:
        """Yields coalesced output until the final chunk; leaving early cancels the sequence."""
        try:
            while True:
                buffered, final = await seq.stream.take()
                if buffered or final is not None:
                    yield merge(buffered, final)
                if final is not None:
                    return
        finally:
            self.cancel(seq)

    def cancel(self, seq: GenSequence) -> None:
        """Marks the sequence; it leaves at the next step boundary (at once if it has not joined)."""
        if seq.done or seq.cancel_step is not None:
            return
        seq.cancel_step = self.steps_started
        if seq.region is None:
            with contextlib.suppress(ValueError):
                self.joining.remove(seq)
            seq.done = True
            _released(seq)
        self._wake.set()

    def begin_drain(self, grace_s: float) -> None:
        """Sequences still running after grace_s end with FINISH_REASON_CANCELLED / SHUTTING_DOWN."""
        self.drain_deadline = time.monotonic() + grace_s
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Plans step N+1 and hands it to the model's thread while step N computes (lookahead.py), then
        delivers N: the model goes from one step to the next without waiting for the event loop."""
        inflight: Inflight | None = None
        while True:
            self._wake.clear()
            now = time.monotonic()
            if self.drain_deadline is not None and now >= self.drain_deadline:
                self._end_all(ShuttingDown("the server is shutting down"))
            self._retire()
            upcoming = self._plan(inflight, now)
            if inflight is not None:
                await self._complete(inflight)
                inflight = upcoming
            elif upcoming is not None:
                inflight = upcoming
            else:
                timeout = self._next_timer(now)
                with contextlib.suppress(TimeoutError):
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a shutdown cancel.
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()

    def _plan(self, inflight: Inflight | None, now: float) -> Inflight | None:
        """The next step, as the sequences will stand once `inflight` is in; handed to the model's thread."""
        runnable, rows = self._runnable(inflight, now)
        prefilling = [s for s in self.active if s.planned < len(s.feed)]
        if len(self.joining) > 1:
            self.joining = deque(sorted(self.joining, key=lambda s: s.rank, reverse=True))
        # Prompts of a higher priority than every decoding stream get the whole step (as on an idle model):
        # a HIGH call is not held to one chunk a step behind LOW streams' tokens.
        waiting = [*prefilling, *self.joining]
        top = max((w.priority for w in waiting), default=None)
        decoding = any(r.priority >= top for r in runnable) if top is not None else bool(runnable)
        work = plan_prefill(
            prefilling,
            self.joining,
            self.memory,
            self.prefill_chunk,
            decoding=decoding,
            preempt=self._preempt,
        )
        kept = [(s, row) for s, row in zip(runnable, rows, strict=True) if s.region is not None]
        runnable, rows = [s for s, _ in kept], [row for _, row in kept]  # less any just preempted
        moves = self.memory.take_moves()
        self._publish_gauges(len(runnable))
        if not runnable and not work.chunks and not moves:
            return None
        step = self.steps_started
        self.steps_started += 1
        self.active.extend(work.joined)
        completing = work.completing
        plan = StepPlan.of(
            moves, work.prefills(), completing, runnable,
            generated=[s.generated for s in completing] + [s.generated + (r >= 0) for s, r in kept],
            positions=[next_position(inflight, s, r) for s, r in kept],
            prev_rows=rows,
        )  # fmt: skip
        future = self.worker.submit_flushing(run_step, self.model, plan, self._chain)
        batch = completing + runnable
        for seq in work.joined:
            if seq.first_step < 0:  # a preempted sequence rejoins: its first step stays
                seq.scheduled, seq.first_step, seq.first_batch = now, step, len(work.chunks) + len(runnable)
        return Inflight(step, future, work, [(s, s.epoch) for s in batch], [(s, s.epoch) for s in runnable])

    def _runnable(self, inflight: Inflight | None, now: float) -> tuple[list[GenSequence], list[int]]:
        """The sequences the next step decodes, and for each the row of the step in flight that computes
        its input token (-1: its last token is known). One that the step in flight ends for certain
        (max_tokens, the context) is not among them."""
        runnable, rows = [], []
        for seq in self.active:
            if seq.planned < len(seq.feed) or seq.done or seq.cancel_step is not None:
                continue  # its feed is still going in, a chunk per step
            row = pending(inflight, seq)
            if row < 0 and seq.prefilled < len(seq.feed):
                continue  # its last chunk is in a step not yet delivered (a preempted row's, say)
            ahead = 1 if row >= 0 else 0
            if seq.generated + ahead >= seq.params.max_tokens:
                continue
            if next_position(inflight, seq, row) + 1 > self.limits.context_length:
                continue
            if seq.stream.has_room(ahead):
                seq.paused_since = None
                runnable.append(seq)
                rows.append(row)
            elif seq.paused_since is None:
                seq.paused_since = now
            elif now - seq.paused_since > self.stall_timeout_s:
                self._m_stalled.inc()
                finish(
                    seq,
                    FinishReason.CANCELLED,
                    error=StalledConsumer(
                        f"the consumer read nothing for {self.stall_timeout_s:g}s; the stream was ended"
                    ),
                )
        return runnable, rows

    async def _complete(self, step: Inflight) -> None:
        """Waits for the step, then commits what it wrote and delivers its tokens."""
        try:
            result = await step.future
        except Exception as exc:  # the whole step failed: its sequences end with an error, others go on
            error = self._step_error(exc)
            chunked = [(seq, seq.epoch) for seq, _, _ in step.work.chunks]
            for seq, epoch in [*chunked, *step.decoding]:
                if epoch == seq.epoch and not seq.done:
                    finish(seq, FinishReason.ERROR, error=error)
            self._last_finished = 0.0
            return
        took = result.finished - result.started
        if self._last_finished and step.decoding:
            gap = result.started - self._last_finished
            self._m_gap.observe(gap)
        self._last_finished = result.finished if step.decoding else 0.0
        self._m_compute.observe(took)
        self.step_s += _STEP_EWMA * (took - self.step_s) if self.step_s else took
        self._m_batch.observe(len(step.work.chunks) + len(step.decoding))
        self._m_tokens.inc(len(result.tokens))
        for seq in step.work.commit():
            self.memory.prefilled(seq)
        for seq, epoch in step.decoding:
            if epoch == seq.epoch:
                seq.position += 1
                self.memory.wrote(seq, seq.last_token)
        for row, ((seq, epoch), token) in enumerate(zip(step.rows, result.tokens, strict=True)):
            if epoch != seq.epoch:
                self.delivery.discard(seq, step.step)  # preempted after it was planned: recomputed later
            else:
                self.delivery.deliver(seq, token, step.step, result.logprobs.get(row))

    def _retire(self) -> None:
        keep = []
        for seq in self.active:
            if seq.done or seq.cancel_step is not None:
                if not seq.done:
                    finish(seq, FinishReason.CANCELLED)
                self.memory.release(seq)
                _released(seq)
            else:
                keep.append(seq)
        self.active = keep

    def _end_all(self, error: SluiceError) -> None:
        for seq in [*self.active, *self.joining]:
            if not seq.done:
                finish(seq, FinishReason.CANCELLED, error=error)
        for seq in self.joining:
            _released(seq)
        self.joining.clear()

    def _next_timer(self, now: float) -> float | None:
        timers = [
            s.paused_since + self.stall_timeout_s - now for s in self.active if s.paused_since is not None
        ]
        if self.drain_deadline is not None:
            timers.append(self.drain_deadline - now)
        return max(min(timers), 0.0) + 0.001 if timers else None

    def _preempt(self, seq: GenSequence) -> None:
        """Frees a running sequence's memory for a higher-priority one: it rejoins to be recomputed from its
        prompt and every token already sent (through the prefix cache while its region is there), so its
        client sees a pause, never a repeat or a gap."""
        self.memory.release(seq)
        self.active.remove(seq)
        seq.epoch += 1  # a row of it in the step in flight is discarded
        seq.feed = seq.prompt + seq.produced
        seq.planned = seq.prefilled = seq.position = 0
        seq.paused_since = None
        self.joining.append(seq)

    def _publish_gauges(self, runnable: int) -> None:
        self._m_active.set(len(self.active))
        self._m_paused.set(len(self.active) - runnable)
        memory, arena = self.memory, self.memory.arena
        values = (memory.holders, memory.written, arena.reserved(), arena.cached(), arena.free_tokens())
        for gauge, value in zip(self._m_kv, values, strict=True):
            gauge.set(value)
        now = time.monotonic()
        if now >= self._kv_published + _KV_GAUGES_S or not memory.holders:
            # It walks every region: a few times a second is what a scrape sees anyway.
            self._kv_published = now
            self._m_fragmentation.set(arena.fragmentation())

    def _step_error(self, exc: Exception) -> SluiceError:
        if isinstance(exc, torch.OutOfMemoryError):  # the worker gave the cached memory back already
            self._oom.record(str(exc))
            return out_of_memory("during a decode step")
        if isinstance(exc, SluiceError):
            return exc
        log.exception("decode step failed", exc_info=exc)
        return ModelFailure(f"the decode step failed: {type(exc).__name__}: {exc}")
