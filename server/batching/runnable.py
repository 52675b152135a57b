"""Which running sequences the next step decodes, as they will stand once the step in flight is in
(lookahead.py): not those still feeding their prompt, nor those the step in flight ends for certain
(max_tokens, the context), nor those whose consumer is behind - those pause with their KV memory kept,
and one whose consumer read nothing for the stall timeout is ended. Those chosen then grow their region to
hold the token they write (KvMemory.grow), in admission's order, so that where memory runs out the
lowest-ranked yields."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import Counter

from server.batching.delivery import finish
from server.batching.lookahead import Inflight, next_position, pending
from server.batching.memory import KvMemory
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


def grown(
    running: list[GenSequence],
    rows: list[int],
    inflight: Inflight | None,
    memory: KvMemory,
    preempt: Callable[[GenSequence], None],
) -> tuple[list[GenSequence], list[int], int | None]:
    """The chosen sequences whose region holds the token the next step writes, after growing them highest
    ranked first; the others were preempted (lowest ranked) or wait a step, in the order given. Last, the
    highest priority preempted (None: none), whose peers do not join this step (plan_prefill)."""
    waiting: set[int] = set()
    yielded: list[int] = []

    def yields(victim: GenSequence) -> None:
        yielded.append(int(victim.priority))
        preempt(victim)

    for index in sorted(range(len(running)), key=lambda i: running[i].rank, reverse=True):
        seq = running[index]
        at = next_position(inflight, seq, rows[index])
        if seq.region is not None and not memory.grow(seq, at, yields):
            waiting.add(id(seq))  # preempted (its region is gone) or waiting for its chunk in flight
    kept = [
        (seq, row)
        for seq, row in zip(running, rows, strict=True)
        if seq.region is not None and id(seq) not in waiting
    ]
    return [seq for seq, _ in kept], [row for _, row in kept], max(yielded, default=None)
