"""Which prompt tokens a step prefills: the chunks of feeds already in a region, then new joiners (which
take their region, and any cached prefix, from KvMemory), within the step's token budget (vLLM's chunked
prefill), so that a long prompt joining delays the running streams by at most one budget of prompt
tokens per step instead of by its whole length. Where cached prefixes are shared in place, a joiner whose
prompt begins as one still being prefilled waits for it and then references it (a burst or n > 1 choices
of one prompt hold it once) instead of computing its own copy."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from server.batching.extras import RequestExtras
from server.batching.memory import KvMemory
from server.batching.sequence import GenSequence
from server.kv.arena import ALIGN
from server.runtimes.base import Prefill

# A step's prompt tokens in all, in chunks: a burst of short prompts joins in one step up to this.
STEP_CHUNKS = 16
#: Leading blocks a joiner must have in common with a prompt still going in to wait for it.
WAIT_BLOCKS = 2


@dataclass(slots=True)
class PrefillWork:
    """One step's prefill chunks (sequence, first feed token, token count); `joined` took a region."""

    chunks: list[tuple[GenSequence, int, int]] = field(default_factory=list)
    joined: list[GenSequence] = field(default_factory=list)

    @property
    def completing(self) -> list[GenSequence]:
        """The sequences whose feed this step finishes: each gets its next token."""
        return [seq for seq, start, n in self.chunks if start + n == len(seq.feed)]

    def prefills(self) -> list[Prefill]:
        """Built once planning is over: a later joiner's compaction may have moved an earlier region."""
        return [
            Prefill(seq.base, seq.feed[start : start + n], start, start + n == len(seq.feed), *seq.prefix)
            for seq, start, n in self.chunks
        ]

    def extras(self) -> list[RequestExtras]:
        """Each chunk's request extras, parallel to prefills()."""
        return [seq.extras for seq, _, _ in self.chunks]

    def add(self, seq: GenSequence, n: int) -> None:
        assert seq.region is not None and n > 0 and seq.planned + n <= len(seq.feed)
        self.chunks.append((seq, seq.planned, n))
        seq.planned += n

    def commit(self) -> list[GenSequence]:
        """After the step ran: the chunks are in the cache. Returns the sequences whose feed is now in."""
        done = []
        for seq, start, n in self.chunks:
            seq.prefilled = max(seq.prefilled, start + n)
            if start + n == len(seq.feed):
                seq.position = len(seq.feed)
                done.append(seq)
        return done


def plan_prefill(
    prefilling: Iterable[GenSequence],
    joining: deque[GenSequence],
    memory: KvMemory,
    chunk: int | None,
    *,
    decoding: bool,
    preempt: Callable[[GenSequence], None],
    going_in: Iterable[GenSequence] = (),
    yielded: int | None = None,
) -> PrefillWork:
    """The step's prompt tokens, in rank order. `chunk` None: whole feeds, every joiner memory allows (a
    runtime that cannot prefill from mid-prompt). Otherwise, as vLLM's chunked prefill: while streams
    decode, a feed longer than `chunk` goes in `chunk` tokens per step, one such feed at a time (later
    long ones take their region now and wait their turn), and shorter ones join whole; a step never takes
    more than STEP_CHUNKS chunks of prompt tokens in all (with nothing decoding, that whole budget may go
    to one long feed). `going_in`: the running sequences whose feed is not yet all written (in a step in
    flight or to come), which a joiner with the same prompt waits for where prefixes are shared.
    `yielded`: the highest priority a growing sequence preempted this step (None: none); no joiner of that
    priority or lower takes the memory so freed, which would only be preempted back (vLLM admits no waiting
    request in a step that preempted)."""
    work = PrefillWork()
    if chunk is None:
        while joining and _may_join(joining[0], yielded) and memory.admit(joining[0], preempt):
            seq = joining.popleft()
            work.joined.append(seq)
            work.add(seq, len(seq.feed) - seq.planned)
        return work
    left = chunk * STEP_CHUNKS
    per_long = chunk if decoding else left
    long_ones = 1 if decoding else len(joining) + 1
    # In admission's order: a HIGH joiner goes before the rest of a LOW prompt already in a region.
    order = sorted([*prefilling, *joining], key=lambda s: s.rank, reverse=True)
    admitting, joined, going_in = True, set(), list(going_in)
    for seq in order:
        if left <= 0:
            break
        if seq.region is None and memory.sharing and _follows(seq, [*going_in, *work.joined], memory):
            continue  # it joins once that prompt is in, referencing it
        if seq.region is None:  # waiting to join
            short = len(seq.feed) <= chunk
            if not admitting or (short and len(seq.feed) > left) or not _may_join(seq, yielded):
                admitting = False  # those behind it keep their turn
                continue
            if not memory.admit(seq, preempt):
                admitting = False
                continue
            work.joined.append(seq)
            joined.add(id(seq))
        size = len(seq.feed) - seq.planned  # what the prefix cache left to compute
        if size <= chunk:
            n = min(size, left)
        elif long_ones:
            n, long_ones = min(per_long, left, size), long_ones - 1
        else:
            continue  # it holds its region (memory, not the prefill rate, bounds what runs at once) and
            # goes in a chunk per step once the long feed before it is in
        work.add(seq, n)
        left -= n
    if joined:
        kept = [seq for seq in joining if id(seq) not in joined]
        joining.clear()
        joining.extend(kept)
    return work


def _may_join(seq: GenSequence, yielded: int | None) -> bool:
    return yielded is None or seq.priority > yielded


def _follows(seq: GenSequence, pending: list[GenSequence], memory: KvMemory) -> bool:
    """Whether a prompt still going in (whose region the cache will find) begins as `seq`'s feed for at
    least WAIT_BLOCKS blocks more than the cache holds now, under the same salt. What the cache holds is
    looked up now, not taken from the joiner's last match: joiners that followed one prompt in all find
    it once it is in, and must then join together, not each wait for the one admitted before it."""
    feed, held = seq.feed, -1
    for other in pending:
        if (
            other.shared is not None
            or other.prefilled >= len(other.feed)
            or other.extras.salt != seq.extras.salt
        ):
            continue
        end = min(len(feed) - 1, len(other.feed)) // ALIGN * ALIGN  # the last token is always computed
        at = 0
        while at < end and feed[at : at + ALIGN] == other.feed[at : at + ALIGN]:
            at += ALIGN
        if at < WAIT_BLOCKS * ALIGN:
            continue
        if held < 0:
            held = memory.cached(seq)
        if at >= held + WAIT_BLOCKS * ALIGN:
            return True
    return False
