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

# A step's prompt tokens in all, in chunks: a burst of short prompts joins in one step up to this.
STEP_CHUNKS = 16


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
        assert seq.slot is not None and n > 0 and end <= len(seq.prompt)
        self.prefills.append(Prefill(seq.slot, seq.prompt[start:end], start, end == len(seq.prompt)))
        self.chunks.append((seq, n))

    def commit(self) -> None:
        """After the step ran: the chunks are in the cache."""
        for seq, n in self.chunks:
            seq.prefilled += n
            if seq.prefilled == len(seq.prompt):
                seq.position = len(seq.prompt)


def plan_prefill(
    prefilling: Iterable[GenSequence],
    joining: deque[GenSequence],
    pool: SlotPool,
    chunk: int | None,
    *,
    decoding: bool,
) -> PrefillWork:
    """The step's prompt tokens, in arrival order. `chunk` None: whole prompts, every joiner a slot allows
    (a runtime that cannot prefill from mid-prompt). Otherwise, as vLLM's chunked prefill: while streams
    decode, a prompt longer than `chunk` goes in `chunk` tokens per step, one such prompt at a time, and
    shorter prompts join whole; a step never takes more than STEP_CHUNKS chunks of prompt tokens in all
    (with nothing decoding, that whole budget may go to one long prompt)."""
    work = PrefillWork()
    if chunk is None:
        while joining and (slot := pool.acquire()) is not None:
            _join(work, joining, pool, slot, None)
        return work
    left = chunk * STEP_CHUNKS
    per_long = chunk if decoding else left
    long_ones = 1 if decoding else len(joining) + 1
    for seq in prefilling:
        if left <= 0 or not long_ones:
            return work
        n = min(per_long, left, len(seq.prompt) - seq.prefilled)
        work.add(seq, n)
        left, long_ones = left - n, long_ones - 1
    while joining and left > 0:
        size = len(joining[0].prompt)
        if size <= chunk:
            if size > left:
                break
            n = size
        elif long_ones:
            n, long_ones = min(per_long, left, size), long_ones - 1
        else:
            break  # a long prompt waits for the one going in; those behind it keep their turn
        slot = pool.acquire()
        if slot is None:
            break
        _join(work, joining, pool, slot, n)
        left -= n
    return work


def _join(work: PrefillWork, joining: deque[GenSequence], pool: SlotPool, slot: int, n: int | None) -> None:
    seq = joining.popleft()
    seq.slot = slot
    pool.set_tokens(slot, len(seq.prompt))
    work.joined.append(seq)
    work.add(seq, len(seq.prompt) if n is None else n)
