"""The step in flight, and what the next step may assume of it.

The scheduler plans and hands over step N+1 while step N computes (vLLM's async scheduling), so the
model's thread goes from one step to the next without waiting for the event loop. Planning N+1 assumes
every sequence of step N takes its token: one more position, one more generated token, its input the
token N samples (taken on the model's thread, StepPlan.prev_rows). A sequence that N ends (EOS or a stop
sequence: max_tokens is foreseen) or that leaves meanwhile computes one token in N+1 that is discarded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from server.batching.prefill import PrefillWork
from server.batching.sequence import GenSequence
from server.batching.step import StepResult


@dataclass(slots=True)
class Inflight:
    """A step handed to the model's thread: its rows (sequence, epoch at planning) in output order - the
    sequences its prefill completes, then the decoding ones - and its prefill chunks."""

    step: int
    future: asyncio.Future[StepResult]
    work: PrefillWork
    rows: list[tuple[GenSequence, int]]
    decoding: list[tuple[GenSequence, int]]
    index: dict[int, int] = field(default_factory=dict)  # id(sequence) -> its output row

    def __post_init__(self) -> None:
        self.index = {id(seq): row for row, (seq, _) in enumerate(self.rows)}


def pending(inflight: Inflight | None, seq: GenSequence) -> int:
    """The output row the step in flight computes for the sequence, or -1."""
    if inflight is None:
        return -1
    row = inflight.index.get(id(seq), -1)
    return row if row >= 0 and inflight.rows[row][1] == seq.epoch else -1


def next_position(inflight: Inflight | None, seq: GenSequence, row: int) -> int:
    """Where the sequence's next token sits once the step in flight is in."""
    if row < 0:
        return seq.position
    if seq.prefilled < len(seq.feed):  # the step in flight completes its feed
        return len(seq.feed)
    return seq.position + 1
