"""Delivery: a step's tokens to their sequences' streams, on the event loop - log-probabilities, text
with stop sequences held back, and how each stream ends (EOS, a stop sequence, max_tokens, an error, a
grammar whose matcher failed); tokens computed for a sequence that has left are counted, never sent."""

from __future__ import annotations

import time

from server.batching.sequence import GenSequence
from server.domain import FinishReason, StreamError, TokenChunk, TokenLogprob, TokenProbability
from server.errors import ConstraintFailed, ConstraintTooComplex, SluiceError, clip
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel

Logprob = tuple[float, list[tuple[int, float]]]
# How llguidance words a per-step limit outgrown (1.9: "Current row has 2001 items; max is 2000", "lexer
# error: too many expressions constructed", fuel): the request's grammar is at fault, not the server.
_LIMIT_WORDS = ("max is", "too many", "too complex", "fuel")


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
        self._m_constraint = {
            kind.reason: metrics.constraint_failures.labels(name, kind.reason)
            for kind in (ConstraintFailed, ConstraintTooComplex)
        }

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

    def deliver(
        self, seq: GenSequence, token: int, step: int, logprob: Logprob | None, *, failure: str | None = None
    ) -> None:
        """`failure`: the row's grammar matcher failed (its token is the EOS its mask then allowed)."""
        if seq.cancel_step is not None or seq.done:
            self.discard(seq, step)  # computed in a step planned before the consumer left; never sent
            return
        if failure is not None:
            self._constraint_failed(seq, failure)
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
            chunk.stop_sequence = seq.text.stopped_by
            _end(seq, FinishReason.STOP, chunk)
        elif seq.generated >= params.max_tokens or seq.position + 1 > self.context_length:
            chunk.text += seq.text.flush()
            _end(seq, FinishReason.LENGTH, chunk)
        else:
            if seq.tools is not None:
                chunk.text = seq.tools.feed(chunk.text)
                if seq.tools.repeated:  # a call made again ends the calls (docs/constrained.md)
                    _end(seq, FinishReason.STOP, chunk, fed=True)
                    return
            seq.stream.push(chunk)

    def _constraint_failed(self, seq: GenSequence, failure: str) -> None:
        """Ends the stream with the matcher's error, never as `stop`: what was streamed stays sent (and the
        text held back for stop sequences follows it), but the output is not what the constraint asked."""
        kind = ConstraintTooComplex if any(w in failure.lower() for w in _LIMIT_WORDS) else ConstraintFailed
        error = kind(
            f"the constraint failed after {seq.generated} generated tokens: {clip(failure, 200)}",
            metadata={"generated_tokens": seq.generated},
        )
        self._m_constraint[error.reason].inc()
        text = seq.text.flush()
        if seq.tools is not None:  # withheld tool-call text stays withheld: the call is incomplete
            text = seq.tools.feed(text)
        finish(seq, FinishReason.ERROR, chunk=TokenChunk(text=text), error=error)

    def _token_logprob(self, token: int, logprob: Logprob) -> TokenLogprob:
        chosen, top = logprob
        token_bytes = self.model.token_bytes
        return TokenLogprob(
            TokenProbability(token, token_bytes(token), chosen),
            tuple(TokenProbability(alt, token_bytes(alt), value) for alt, value in top),
        )


def _end(seq: GenSequence, reason: FinishReason, chunk: TokenChunk, *, fed: bool = False) -> None:
    """Ends a stream that ran its course; a generation with tools turns its withheld text into calls
    (`fed`: the chunk's text has been through them already)."""
    if seq.tools is not None:
        shown = chunk.text if fed else seq.tools.feed(chunk.text)
        rest, calls = seq.tools.finish(cut=reason is FinishReason.LENGTH)
        chunk.text = shown + rest
        if calls and (reason is FinishReason.STOP or seq.tools.repeated):
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
