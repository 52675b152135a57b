"""Which prompt tokens a step prefills: the chunks of prompts already in a slot, then new joiners, within
the step's token budget (vLLM's chunked prefill), so that a long prompt joining delays the running streams
by at most one budget of prompt tokens per step instead of by its whole length."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from server.batching.sequence import GenSequence
from server.batching.slots import SlotPool
from server.runtimes.base import Prefill


@dataclass(slots=True)
class PrefillWork:
    """One step's prefills, with the sequence and token count of each; `joined` took a slot this step."""

    prefills: list[Prefill] = field(default_factory=list)
    chunks: list[tuple[GenSequence, int]] = field(default_factory=list)
    joined: list[GenSequence] = field(default_factory=list)

    @property
    def completing(self) -> list[GenSequence]:
        """The sequences whose prompt this step finishes: each gets its first token."""
        return [seq for seq, n in self.chunks if seq.prefilled + n == len(seq.prompt)]

    def add(self, seq: GenSequence, n: int) -> None:
        start = seq.prefilled
        end = start + n
        assert seq.slot is not None
        self.prefills.append(Prefill(seq.slot, seq.prompt[start:end], start, end == len(seq.prompt)))
        self.chunks.append((seq, n))

    def commit(self) -> None:
        """After the step ran: the chunks are in the cache."""
        for seq, n in self.chunks:
            seq.prefilled += n
            if seq.prefilled == len(seq.prompt):
                seq.position = len(seq.prompt)


def plan_prefill(
    prefilling: Iterable[GenSequence], joining: deque[GenSequence], pool: SlotPool, budget: int | None
) -> PrefillWork:
    """`budget` None: whole prompts, every joiner a slot allows (a runtime that cannot prefill mid-prompt).
    Otherwise prompts in arrival order take up to `budget` tokens in all; a prompt that does not fit is
    split, and its rest goes first next step."""
    work = PrefillWork()
    left = budget
    for seq in prefilling:
        if left is not None and left <= 0:
            return work
        n = len(seq.prompt) - seq.prefilled if left is None else min(left, len(seq.prompt) - seq.prefilled)
        work.add(seq, n)
        left = None if left is None else left - n
    while joining and (left is None or left > 0) and (slot := pool.acquire()) is not None:
        seq = joining.popleft()
        seq.slot = slot
        pool.set_tokens(slot, len(seq.prompt))
        work.joined.append(seq)
        n = len(seq.prompt) if left is None else min(left, len(seq.prompt))
        work.add(seq, n)
        left = None if left is None else left - n
    return work
