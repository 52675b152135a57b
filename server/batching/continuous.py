"""ContinuousScheduler: iteration-level batching for Generate.

Each iteration is a step boundary: finished, cancelled and stalled sequences leave and free their KV slot;
waiting sequences join (prefilled in the same worker call); then one decode step runs over every sequence
whose consumer has room. Paused sequences keep their cache and rejoin when their consumer catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import torch

from server.batching.oom import OomRecovery, out_of_memory
from server.batching.prefill import PrefillWork, plan_prefill
from server.batching.requests import RequestLimits, resolve_request
from server.batching.sequence import GenSequence
from server.batching.slots import SlotPool
from server.batching.step import StepPlan, run_step
from server.batching.stream import TokenStream, merge
from server.batching.text import TextAssembler
from server.batching.worker import ModelWorker
from server.domain import (
    FinishReason,
    GenerateSpec,
    StreamError,
    TokenChunk,
    TokenLogprob,
    TokenProbability,
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
        max_sequences: int,
        limits: RequestLimits,
        stream_buffer: int,
        stall_timeout_s: float,
        breaker: MemoryBreaker | None,
        metrics: Metrics,
        prefill_chunk_tokens: int | None = None,
        device_label: str = "",  # which device's replica, in the metrics (--devices); "": the model's device
    ) -> None:
        self.model = model
        self.worker = worker
        self.pool = SlotPool(max_sequences, limits.context_length)
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
        self._wake = asyncio.Event()
        name = model.descriptor.name
        self._m_tokens = metrics.tokens.labels(name)
        self._m_discarded = metrics.tokens_discarded.labels(name)
        self._m_after_cancel = metrics.tokens_after_cancel.labels(name)
        self._m_active = metrics.sequences.labels(name)
        self._m_paused = metrics.sequences_paused.labels(name)
        self._m_stalled = metrics.stalled.labels(name)
        self._m_slots = metrics.kv_slots.labels(name)
        self._m_kv_tokens = metrics.kv_tokens.labels(name)
        self._m_ttft = metrics.ttft.labels(name)
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

    def submit(self, spec: GenerateSpec, *, on_release: Callable[[], None] | None = None) -> GenSequence:
        """Validates against the model's limits (raising before the stream starts) and queues to join.
        `on_release` is called once the sequence has left and its KV slot is free."""
        prompt, params = resolve_request(spec, self.model, self.limits)
        seed = spec.sampling.seed if spec.sampling.seed is not None else secrets.randbits(63)
        seq = GenSequence(
            prompt,
            params,
            seed,
            TokenStream(self.stream_buffer, self._wake.set),
            TextAssembler(params.stop, strip_leading_space=self.model.strips_leading_space),
            time.monotonic(),
            on_release=on_release,
        )
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
        if seq.slot is None:
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
        while True:
            self._wake.clear()
            now = time.monotonic()
            if self.drain_deadline is not None and now >= self.drain_deadline:
                self._end_all(ShuttingDown("the server is shutting down"))
            self._retire()
            runnable = self._runnable(now)
            prefilling = (s for s in self.active if s.prefilled < len(s.prompt))
            work = plan_prefill(
                prefilling, self.joining, self.pool, self.prefill_chunk, decoding=bool(runnable)
            )
            self._publish_gauges(len(runnable))
            if not runnable and not work.chunks:
                timeout = self._next_timer(now)
                with contextlib.suppress(TimeoutError):
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a shutdown cancel.
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                continue
            await self._step(work, runnable)

    def _runnable(self, now: float) -> list[GenSequence]:
        runnable = []
        for seq in self.active:
            if seq.prefilled < len(seq.prompt):
                continue  # its prompt is still going in, a chunk per step
            if seq.stream.has_room():
                seq.paused_since = None
                runnable.append(seq)
            elif seq.paused_since is None:
                seq.paused_since = now
            elif now - seq.paused_since > self.stall_timeout_s:
                self._m_stalled.inc()
                self._finish(
                    seq,
                    FinishReason.CANCELLED,
                    error=StalledConsumer(
                        f"the consumer read nothing for {self.stall_timeout_s:g}s; the stream was ended"
                    ),
                )
        return runnable

    async def _step(self, work: PrefillWork, runnable: list[GenSequence]) -> None:
        step = self.steps_started
        self.steps_started += 1
        completing = work.completing
        batch = completing + runnable
        plan = StepPlan.of(work.prefills, completing, runnable)
        started = time.monotonic()
        self.active.extend(work.joined)
        try:
            result = await self.worker.run(run_step, self.model, plan)
        except Exception as exc:  # the whole step failed: its sequences end with an error, others go on
            error = self._step_error(exc)
            for seq in [*(seq for seq, _ in work.chunks), *runnable]:
                self._finish(seq, FinishReason.ERROR, error=error)
            return
        took = time.monotonic() - started
        self._m_compute.observe(took)
        self.step_s += _STEP_EWMA * (took - self.step_s) if self.step_s else took
        self._m_batch.observe(len(work.chunks) + len(runnable))
        tokens = result.tokens
        self._m_tokens.inc(len(tokens))
        work.commit()
        for seq in runnable:
            seq.position += 1
        for row, (seq, token) in enumerate(zip(batch, tokens, strict=True)):
            self._deliver(seq, token, step, result.logprobs.get(row))

    def _deliver(
        self, seq: GenSequence, token: int, step: int, logprob: tuple[float, list[tuple[int, float]]] | None
    ) -> None:
        if seq.cancel_step is not None or seq.done:
            # Computed in the step that was in flight when the consumer left; never sent.
            (
                self._m_after_cancel
                if seq.cancel_step is not None and seq.cancel_step < step
                else self._m_discarded
            ).inc()
            return
        if seq.generated == 0:
            self._m_ttft.observe(time.monotonic() - seq.arrived)
        seq.generated += 1
        seq.last_token = token
        if seq.slot is not None:
            self.pool.set_tokens(seq.slot, seq.position)
        logprobs = [self._token_logprob(token, logprob)] if logprob is not None else []
        if token == self.model.eos_id and not seq.params.ignore_eos:
            chunk = TokenChunk(text=seq.text.flush(), token_ids=[token], logprobs=logprobs)
            self._finish(seq, FinishReason.STOP, chunk=chunk)
            return
        text, stopped = seq.text.feed(
            self.model.token_bytes(token), may_stop=seq.generated >= seq.params.min_tokens
        )
        chunk = TokenChunk(text=text, token_ids=[token], logprobs=logprobs)
        if stopped:
            self._finish(seq, FinishReason.STOP, chunk=chunk)
        elif seq.generated >= seq.params.max_tokens or seq.position + 1 > self.pool.context_length:
            chunk.text += seq.text.flush()
            self._finish(seq, FinishReason.LENGTH, chunk=chunk)
        else:
            seq.stream.push(chunk)

    def _token_logprob(self, token: int, logprob: tuple[float, list[tuple[int, float]]]) -> TokenLogprob:
        chosen, top = logprob
        token_bytes = self.model.token_bytes
        return TokenLogprob(
            TokenProbability(token, token_bytes(token), chosen),
            tuple(TokenProbability(alt, token_bytes(alt), value) for alt, value in top),
        )

    def _finish(
        self,
        seq: GenSequence,
        reason: FinishReason,
        *,
        chunk: TokenChunk | None = None,
        error: SluiceError | None = None,
    ) -> None:
        final = chunk or TokenChunk()
        final.finish_reason = reason
        final.usage = seq.usage()
        if error is not None:
            final.error = StreamError(code=error.code, message=error.message, reason=error.reason)
        seq.stream.finish(final)
        seq.done = True

    def _retire(self) -> None:
        keep = []
        for seq in self.active:
            if seq.done or seq.cancel_step is not None:
                if not seq.done:
                    self._finish(seq, FinishReason.CANCELLED)
                if seq.slot is not None:
                    self.pool.release(seq.slot)
                    self.model.release(seq.slot)
                    seq.slot = None
                _released(seq)
            else:
                keep.append(seq)
        self.active = keep

    def _end_all(self, error: SluiceError) -> None:
        for seq in [*self.active, *self.joining]:
            if not seq.done:
                self._finish(seq, FinishReason.CANCELLED, error=error)
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

    def _publish_gauges(self, runnable: int) -> None:
        self._m_active.set(len(self.active))
        self._m_paused.set(len(self.active) - runnable)
        self._m_slots.set(self.pool.in_use)
        self._m_kv_tokens.set(self.pool.tokens_in_use)

    def _step_error(self, exc: Exception) -> SluiceError:
        if isinstance(exc, torch.OutOfMemoryError):  # the worker gave the cached memory back already
            self._oom.record(str(exc))
            return out_of_memory("during a decode step")
        if isinstance(exc, SluiceError):
            return exc
        log.exception("decode step failed", exc_info=exc)
        return ModelFailure(f"the decode step failed: {type(exc).__name__}: {exc}")
