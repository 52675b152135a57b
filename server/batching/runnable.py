"""Which running sequences the next step decodes, as they will stand once the step in flight is in
(lookahead.py): not those still feeding their prompt, nor those the step in flight ends for certain
(max_tokens, the context), nor those whose consumer is behind - those pause with their KV memory kept,
and one whose consumer read nothing for the stall timeout is ended."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter

from server.batching.delivery import finish
from server.batching.lookahead import Inflight, next_position, pending
from server.batching.sequence import GenSequence
from server.domain import FinishReason
from server.errors import StalledConsumer


def runnable(
    active: Sequence[GenSequence],
    inflight: Inflight | None,
    now: float,
    *,
    context_length: int,
    stall_timeout_s: float,
    stalled: Counter,
) -> tuple[list[GenSequence], list[int]]:
    """The sequences the next step decodes, and for each the row of the step in flight that computes its
    input token (-1: its last token is known)."""
    chosen, rows = [], []
    for seq in active:
        if seq.planned < len(seq.feed) or seq.done or seq.cancel_step is not None:
            continue  # its feed is still going in, a chunk per step
        row = pending(inflight, seq)
        if row < 0 and seq.prefilled < len(seq.feed):
            continue  # its last chunk is in a step not yet delivered (a preempted row's, say)
        ahead = 1 if row >= 0 else 0
        if seq.generated + ahead >= seq.params.max_tokens:
            continue
        if next_position(inflight, seq, row) + 1 > context_length:
            continue
        if seq.stream.has_room(ahead):
            seq.paused_since = None
            chosen.append(seq)
            rows.append(row)
        elif seq.paused_since is None:
            seq.paused_since = now
        elif now - seq.paused_since > stall_timeout_s:
            stalled.inc()
            finish(
                seq,
                FinishReason.CANCELLED,
                error=StalledConsumer(
                    f"the consumer read nothing for {stall_timeout_s:g}s; the stream was ended"
                ),
            )
    return chosen, rows
