"""Delivery: a step's tokens to their sequences' streams, on the event loop - log-probabilities, text
with stop sequences held back, and how each stream ends (EOS, a stop sequence, max_tokens, an error);
tokens computed for a sequence that has left are counted, never sent."""

from __future__ import annotations

import time

from server.batching.sequence import GenSequence
from server.domain import FinishReason, StreamError, TokenChunk, TokenLogprob, TokenProbability
from server.errors import SluiceError
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel

Logprob = tuple[float, list[tuple[int, float]]]


class Delivery:
    def __init__(self, model: GenerativeModel, context_length: int, metrics: Metrics) -> None:
        self.model, self.context_length = model, context_length
        name = model.descriptor.name
        discarded = metrics.tokens_discarded
        self._m_cancelled = discarded.labels(name, "cancelled")
        self._m_finished = discarded.labels(name, "finished")
        self._m_preempted = discarded.labels(name, "preempted")
        self._m_after_cancel = metrics.tokens_after_cancel.labels(name)
        self._m_ttft = metrics.ttft.labels(name)

    def discard(self, seq: GenSequence, step: int, *, preempted: bool = False) -> None:
        """A token computed for a sequence that left, ended or was preempted after its step was planned,
        counted by why: only `cancelled` (and the after-cancel count) is a caller that left."""
        if seq.cancel_step is not None and seq.cancel_step < step:
            self._m_after_cancel.inc()
        elif preempted:
            self._m_preempted.inc()
        elif seq.cancel_step is not None:
            self._m_cancelled.inc()
        else:  # it ended itself (EOS, a stop sequence, an error): the step planned behind its last one
            self._m_finished.inc()

    def deliver(self, seq: GenSequence, token: int, step: int, logprob: Logprob | None) -> None:
        if seq.cancel_step is not None or seq.done:
            self.discard(seq, step)  # computed in a step planned before the consumer left; never sent
            return
        now = seq.last_token_at = time.monotonic()
        if seq.generated == 0:
            seq.first_token_at = now
            self._m_ttft.observe(now - seq.arrived)
        seq.generated += 1
        seq.last_token = token
        seq.produced.append(token)
        logprobs = [self._token_logprob(token, logprob)] if logprob is not None else []
        params = seq.params
        if (token == self.model.eos_id and not params.ignore_eos) or token in params.stop_token_ids:
            chunk = TokenChunk(text=seq.text.flush(), token_ids=[token], logprobs=logprobs)
            _end(seq, FinishReason.STOP, chunk)
            return
        text, stopped = seq.text.feed(
            self.model.token_bytes(token), may_stop=seq.generated >= params.min_tokens
        )
        chunk = TokenChunk(text=text, token_ids=[token], logprobs=logprobs)
        if stopped:
            _end(seq, FinishReason.STOP, chunk)
        elif seq.generated >= params.max_tokens or seq.position + 1 > self.context_length:
            chunk.text += seq.text.flush()
            _end(seq, FinishReason.LENGTH, chunk)
        else:
            if seq.tools is not None:
                chunk.text = seq.tools.feed(chunk.text)
            seq.stream.push(chunk)

    def _token_logprob(self, token: int, logprob: Logprob) -> TokenLogprob:
        chosen, top = logprob
        token_bytes = self.model.token_bytes
        return TokenLogprob(
            TokenProbability(token, token_bytes(token), chosen),
            tuple(TokenProbability(alt, token_bytes(alt), value) for alt, value in top),
        )


def _end(seq: GenSequence, reason: FinishReason, chunk: TokenChunk) -> None:
    """Ends a stream that ran its course; a generation with tools turns its withheld text into calls."""
    if seq.tools is not None:
        shown = seq.tools.feed(chunk.text)
        rest, calls = seq.tools.finish(cut=reason is FinishReason.LENGTH)
        chunk.text = shown + rest
        if calls and reason is FinishReason.STOP:
            chunk.tool_calls, reason = calls, FinishReason.TOOL_CALLS
        elif calls:  # cut off by max_tokens after complete calls: still reported, with finish "length"
            chunk.tool_calls = calls
    finish(seq, reason, chunk=chunk)


def finish(
    seq: GenSequence,
    reason: FinishReason,
    *,
    chunk: TokenChunk | None = None,
    error: SluiceError | None = None,
) -> None:
    """Ends the sequence's stream with its final chunk (usage, and the error where there is one)."""
    final = chunk or TokenChunk()
    final.finish_reason = reason
    final.usage = seq.usage()
    final.timings = seq.timings(time.monotonic())
    if error is not None:
        final.error = StreamError(code=error.code, message=error.message, reason=error.reason)
    seq.stream.finish(final)
    seq.done = True
