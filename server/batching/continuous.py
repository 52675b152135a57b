"""ContinuousScheduler: iteration-level batching for Generate.

Each iteration is a step boundary: finished, cancelled and stalled sequences leave and give their KV region
up (to the prefix cache); decoding sequences grow theirs; waiting sequences join in admission's order,
taking a region of their prompt and a look-ahead and any cached prefix (KvMemory, which may preempt: the
preempted rejoin and are recomputed); then one decode step runs over every sequence whose consumer has
room. Paused sequences keep their cache and rejoin when their consumer catches up."""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import llguidance

from server.batching.delivery import Delivery, finish
from server.batching.extras import RequestExtras
from server.batching.gauges import SchedulerGauges
from server.batching.lookahead import Inflight, next_position
from server.batching.memory import KvMemory
from server.batching.oom import OomRecovery, step_failure
from server.batching.prefill import plan_prefill
from server.batching.requests import RequestLimits, resolve_request
from server.batching.runnable import grown, runnable
from server.batching.sequence import GenSequence
from server.batching.shaping import OutputShaping
from server.batching.step import StepChain, StepPlan, run_step
from server.batching.stream import TokenStream, merge
from server.batching.text import TextAssembler
from server.batching.worker import ModelWorker
from server.domain import FinishReason, GenerateSpec, TokenChunk
from server.errors import ShuttingDown, SluiceError
from server.kv.prefix import PrefixEvents
from server.memory.breaker import MemoryBreaker
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel

_STEP_EWMA = 0.05


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
        prefix_sharing: bool = True,  # a cached prefix is attended in place where the runtime can
        device_label: str = "",  # which device's replica, in the metrics (--devices); "": the model's device
        prompt_check: Callable[[str, GenerateSpec, int], SluiceError | None] | None = None,  # admission's
        kv_events: PrefixEvents | None = None,  # --kv-events-endpoint (server/kv/events.py)
    ) -> None:
        self.model, self.worker, name = model, worker, model.descriptor.name
        sharing = prefix_sharing and model.shares_prefixes
        self.memory = KvMemory(kv_tokens, prefix_cache=prefix_cache, metrics=metrics, model=name,
                               sharing=sharing, events=kv_events)  # fmt: skip
        self.limits, self.stream_buffer, self.stall_timeout_s = limits, stream_buffer, stall_timeout_s
        self.prompt_check = prompt_check  # policies that need the prompt's token count (their `prompt`)
        # None: whole prompts (a runtime that cannot prefill from mid-prompt), as many as slots allow.
        self.prefill_chunk = prefill_chunk_tokens if model.chunked_prefill else None
        self.joining: deque[GenSequence] = deque()
        self.active: list[GenSequence] = []
        self.steps_started = 0
        self.step_s = 0.0  # EWMA of a step's duration: what one more token of a stream costs now
        self.output_tokens = 128.0  # EWMA of finished streams' output tokens (first: the old default)
        self.drain_deadline: float | None = None
        self._chain = StepChain(worker.flush)
        self.delivery = Delivery(model, limits.context_length, metrics)
        self.shaping = OutputShaping(model)
        self._wake = asyncio.Event()
        self.gauges = SchedulerGauges(metrics, name, device_label or model.descriptor.device)
        self._oom = OomRecovery(name, breaker=breaker, counter=metrics.oom.labels(name))

    # -- the request side (event loop) ------------------------------------------------------------
    def service_estimate_s(self, max_tokens: int) -> float:
        """How long a stream asking for `max_tokens` takes at the measured step rate (0: the operator's cap,
        else as long as finished streams' outputs were on average: most end at EOS, long before the
        context); 0 before the first step. Admission's deadline estimate for Generate."""
        tokens = max_tokens or self.limits.default_max_tokens or round(self.output_tokens)
        return min(tokens, self.limits.context_length) * self.step_s

    async def prepare(self, spec: GenerateSpec) -> llguidance.LLMatcher | None:
        """The spec's constraint compiled off the event loop (None without one); pass it to submit."""
        return await self.shaping.prepare(spec)

    def submit(
        self,
        spec: GenerateSpec,
        *,
        on_release: Callable[[], None] | None = None,
        deadline: float | None = None,
        extras: RequestExtras = RequestExtras(),  # noqa: B008 (frozen)
        matcher: llguidance.LLMatcher | None = None,
        admission_wait_s: float = 0.0,
    ) -> GenSequence:
        """Validates against the model's limits (raising before the stream starts) and queues to join.
        `on_release` is called once the sequence has left and given its KV region up; `deadline`
        (monotonic) and the spec's priority rank it for memory; `extras` (the salt that scopes its prefix
        cache) are resolved once for every API (server/submission.py); `admission_wait_s`, the wait for
        its slot, counts in its timings."""
        prompt, params = resolve_request(spec, self.model, self.limits)
        name = self.model.descriptor.name
        if self.prompt_check and (refused := self.prompt_check(name, spec, len(prompt))):
            raise refused
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
            extras=extras,
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
            seq.released()
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
            if inflight is not None or upcoming is not None:
                inflight = upcoming
            else:
                timeout = self._next_timer(now)
                with contextlib.suppress(TimeoutError):
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a shutdown cancel.
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()

    def _plan(self, inflight: Inflight | None, now: float) -> Inflight | None:
        """The next step, as the sequences will stand once `inflight` is in; handed to the model's thread."""
        running, rows = runnable(
            self.active, inflight, now, context_length=self.limits.context_length,
            stall_timeout_s=self.stall_timeout_s, stalled=self.gauges.stalled,
        )  # fmt: skip
        running, rows, yielded = grown(running, rows, inflight, self.memory, self._preempt)
        prefilling = [s for s in self.active if s.planned < len(s.feed)]
        if len(self.joining) > 1:
            self.joining = deque(sorted(self.joining, key=lambda s: s.rank, reverse=True))
        # Prompts of a higher priority than every decoding stream get the whole step (as on an idle model):
        # a HIGH call is not held to one chunk a step behind LOW streams' tokens.
        waiting = [*prefilling, *self.joining]
        top = max((w.priority for w in waiting), default=None)
        decoding = any(r.priority >= top for r in running) if top is not None else bool(running)
        work = plan_prefill(
            prefilling, self.joining, self.memory, self.prefill_chunk, decoding=decoding,
            preempt=self._preempt, going_in=[s for s in self.active if s.prefilled < len(s.feed)],
            yielded=yielded,
        )  # fmt: skip
        kept = [(s, row) for s, row in zip(running, rows, strict=True) if s.region is not None]
        running, rows = [s for s, _ in kept], [row for _, row in kept]  # less any just preempted
        moves, compactions = self.memory.take_moves()
        self.gauges.sequences(len(self.active), len(running), self.memory)
        if not running and not work.chunks and not moves:
            return None
        step = self.steps_started
        self.steps_started += 1
        self.active.extend(work.joined)
        completing = work.completing
        plan = StepPlan.of(
            moves, work.prefills(), completing, running, prefill_extras=work.extras(),
            generated=[s.generated for s in completing] + [s.generated + (r >= 0) for s, r in kept],
            positions=[next_position(inflight, s, r) for s, r in kept],
            prev_rows=rows, compactions=compactions,
        )  # fmt: skip
        future = self.worker.submit_flushing(run_step, self.model, plan, self._chain)
        batch = completing + running
        for seq in work.joined:
            if seq.first_step < 0:  # a preempted sequence rejoins: its first step stays
                seq.scheduled, seq.first_step, seq.first_batch = now, step, len(work.chunks) + len(running)
        return Inflight(step, future, work, [(s, s.epoch) for s in batch], [(s, s.epoch) for s in running])

    async def _complete(self, step: Inflight) -> None:
        """Waits for the step, then commits what it wrote and delivers its tokens."""
        try:
            result = await step.future
        except Exception as exc:  # the whole step failed: its sequences end with an error, others go on
            error = step_failure(exc, self._oom)
            chunked = [(seq, seq.epoch) for seq, _, _ in step.work.chunks]
            for seq, epoch in [*chunked, *step.decoding]:
                if epoch == seq.epoch and not seq.done:
                    finish(seq, FinishReason.ERROR, error=error)
            self.gauges.failed()
            return
        batch = len(step.work.chunks) + len(step.decoding)
        took = self.gauges.step(result, batch, decoding=bool(step.decoding))
        self.step_s += _STEP_EWMA * (took - self.step_s) if self.step_s else took
        for seq in step.work.commit():
            self.memory.prefilled(seq)
        for seq, epoch in step.decoding:
            if epoch == seq.epoch:
                seq.position += 1
                self.memory.wrote(seq, seq.last_token)
        for row, ((seq, epoch), token) in enumerate(zip(step.rows, result.tokens, strict=True)):
            if epoch != seq.epoch:
                self.delivery.discard(seq, step.step, preempted=True)  # recomputed when it resumes
            else:
                failure = result.failures.get(row)
                self.delivery.deliver(seq, token, step.step, result.logprobs.get(row), failure=failure)

    def _retire(self) -> None:
        keep = []
        for seq in self.active:
            if seq.done or seq.cancel_step is not None:
                if not seq.done:
                    finish(seq, FinishReason.CANCELLED)
                else:
                    self.output_tokens += _STEP_EWMA * (seq.generated - self.output_tokens)
                self.memory.release(seq)
                seq.released()
            else:
                keep.append(seq)
        self.active = keep

    def _end_all(self, error: SluiceError) -> None:
        for seq in [*self.active, *self.joining]:
            if not seq.done:
                finish(seq, FinishReason.CANCELLED, error=error)
        for seq in self.joining:
            seq.released()
        self.joining.clear()

    def _next_timer(self, now: float) -> float | None:
        timers = [s.paused_since + self.stall_timeout_s - now for s in self.active if s.paused_since]
        if self.drain_deadline is not None:
            timers.append(self.drain_deadline - now)
        return max(min(timers), 0.0) + 0.001 if timers else None

    def _preempt(self, seq: GenSequence) -> None:
        """Frees a running sequence's memory: it rejoins to be recomputed from its prompt and every token
        sent (through the prefix cache while its region is there); its client sees a pause, never a gap."""
        self.memory.release(seq)
        self.active.remove(seq)
        seq.epoch += 1  # a row of it in the step in flight is discarded
        seq.feed = seq.prompt + seq.produced
        seq.planned = seq.prefilled = seq.position = 0
        seq.paused_since = None
        self.joining.append(seq)
