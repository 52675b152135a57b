"""KvMemory: the scheduler's KV arena with its prefix cache, and who gets memory when it is short.

A joining sequence reserves its feed plus a look-ahead of LOOKAHEAD tokens (none where memory is short;
never more than its prompt plus max_tokens), exact to the arena's alignment, after taking the longest
cached prefix of its prompt (copied into its own region before the step: one copy instead of a prefill,
or referenced in place); a decoding sequence grows by as much when it reaches its region's end (vLLM's
block-by-block growth). When no hole holds either, memory is found in this order: evict cached prefixes,
least recently used first; compact the arena if its free tokens would do; preempt running sequences
that admission ranks lowest, whose regions become cached prefixes and who rejoin to be recomputed from
their prompt and the tokens already sent. A joiner preempts only sequences of lower priority; a growing
sequence the lowest-ranked of all, itself included (vLLM's recompute preemption: the youngest of equals
yields, so equals never take turns).
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable

from server.batching.sequence import GenSequence
from server.kv.arena import ALIGN, Region, RegionArena, aligned
from server.kv.prefix import PrefixCache, PrefixEvents
from server.metrics import Metrics

#: Cached prefixes kept at most, whatever memory is free: each holds its token ids on the event loop's side
#: (4 bytes a token) and makes first-fit and eviction scan further.
MAX_CACHED = 4096

#: Tokens a sequence holds beyond those it has written, grown by at a time: small (half unused on average;
#: with the alignment 24 tokens, under 10% of a 300-token chat turn), and a growth planned every 32 steps.
LOOKAHEAD = 32
#: The look-ahead where the arena (free and evictable) lacks LOOKAHEAD tokens for every holder: none, as
#: vLLM's allocate_slots gives a decoding request the slot it writes (its region ends on the alignment).
SHORT_LOOKAHEAD = 0

# A shorter prefix is copied, not referenced: attending it apart (cascade attention, float32) costs more than
# its memory saves (SmolLM2, 32 streams on a 43-token chat prompt: a step ~99 ms referenced, 72 ms copied).
# vLLM applies cascade attention from a 256-token common prefix on.
MIN_SHARED = 256


class KvMemory:
    def __init__(
        self, tokens: int, *, prefix_cache: bool, metrics: Metrics, model: str, max_cached: int = MAX_CACHED,
        sharing: bool = False, events: PrefixEvents | None = None, min_shared: int = MIN_SHARED,
    ) -> None:  # fmt: skip
        self.arena = RegionArena(tokens)
        self.prefix = PrefixCache(enabled=prefix_cache, events=events)
        # A hit is attended where it lies (the runtime reads a prefix apart: StepAttention), not copied.
        self.sharing, self.min_shared = sharing and prefix_cache, min_shared
        # Tokens held beyond those written, and where memory is short; a benchmark sets both past max_tokens
        # to measure the up-front reservation that came before growth (each held its prompt and max_tokens).
        self.lookahead, self.short_lookahead = LOOKAHEAD, SHORT_LOOKAHEAD
        self.moves: list[tuple[int, int, int]] = []  # for the model before the next step, in order
        self.compactions: list[tuple[int, int]] = []  # [start, end) of the moves each compaction made
        self._holders: dict[int, GenSequence] = {}  # id(region) -> its running sequence
        self._cached: OrderedDict[int, Region] = OrderedDict()  # id -> cached prefix, least recent first
        self._max_cached = max_cached
        self._m = (
            metrics.prefix_hits.labels(model),
            metrics.prefix_tokens.labels(model),
            metrics.prefix_evictions.labels(model),
            metrics.preemptions.labels(model),
            metrics.recomputed.labels(model),
            metrics.kv_compactions.labels(model),
        )

    @property
    def holders(self) -> int:
        """Sequences holding a region."""
        return len(self._holders)

    @property
    def written(self) -> int:
        """Tokens running sequences have written in their own regions."""
        return sum(seq.region.written for seq in self._holders.values() if seq.region is not None)

    @property
    def shared(self) -> int:
        """Tokens of regions running sequences attend in place (cached or another's), each counted once."""
        regions = {id(s.shared): s.shared for s in self._holders.values() if s.shared is not None}
        return sum(region.size for region in regions.values())

    @property
    def held(self) -> int:
        """Tokens running sequences hold: their own regions and the cached prefixes they attend."""
        return self.arena.reserved() + sum(region.size for region in self._cached.values() if region.refs)

    def cached(self, seq: GenSequence) -> int:
        """Leading tokens of the sequence's feed the prefix cache holds now (dictionary lookups: its block
        hashes are kept on the request)."""
        hit = self.prefix.match(seq.feed, seq.extras.salt, seq.blocks)
        return hit.tokens if hit is not None else 0

    def take_moves(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """The moves for the next step, in order, and the spans of them each compaction made (timed)."""
        moves, spans, self.moves, self.compactions = self.moves, self.compactions, [], []
        return moves, spans

    def admit(self, seq: GenSequence, preempt: Callable[[GenSequence], None]) -> bool:
        """Gives the sequence a region (and whatever cached prefix it has); False: not now."""
        hit = self.prefix.match(seq.feed, seq.extras.salt, seq.blocks)
        need = min(len(seq.feed) + self._ahead(), self.limit(seq))
        shared = hit.tokens if hit is not None and self.sharing and hit.tokens >= self.min_shared else 0
        keep = {id(hit.region)} if hit is not None else set()
        region = self._reserve(need - shared, seq, keep, preempt)
        if region is None and hit is not None:
            # The prefix and the region cannot both be held (a long feed in a small arena): recompute it.
            hit, shared, region = None, 0, self._reserve(need, seq, set(), preempt)
        if region is None:
            return False
        region.tokens = array("i", seq.feed if not shared else ())  # a region of a suffix is never a hit
        self._holders[id(region)] = seq
        seq.region, seq.planned, seq.prefilled, seq.position = region, 0, 0, 0
        if seq.produced:  # a preempted sequence resumes: what the cache no longer holds is computed again
            self._m[4].inc(len(seq.feed) - (hit.tokens if hit is not None else 0))
        if hit is not None:
            if shared:
                seq.shared, seq.shared_tokens = hit.region, shared
                hit.region.refs += 1
            else:
                self.moves.append((hit.region.base, region.base, hit.tokens))
                region.written = hit.tokens
            hit.region.last_used = time.monotonic()
            if id(hit.region) in self._cached:
                self._cached.move_to_end(id(hit.region))
            seq.planned = seq.prefilled = hit.tokens
            hits, saved = self._m[0], self._m[1]
            hits.inc()
            saved.inc(hit.tokens)
            if not seq.produced:  # what the caller is told; a resumed sequence's reuse is the server's
                seq.cached_tokens = hit.tokens
        return True

    @staticmethod
    def limit(seq: GenSequence) -> int:
        """Tokens the sequence can ever write: its prompt and max_tokens (the last token is not written, the
        look-ahead step's discarded one is)."""
        return len(seq.prompt) + seq.params.max_tokens

    def grow(self, seq: GenSequence, position: int, preempt: Callable[[GenSequence], None]) -> bool:
        """Makes the sequence's region hold `position` (the next step writes there), growing it by LOOKAHEAD;
        False: it cannot decode this step (it was preempted itself, or waits for its chunk in flight)."""
        region, shared = seq.region, seq.shared_tokens
        assert region is not None
        if position - shared < region.size:
            return True
        need = max(min(position + 1 + self._ahead(), self.limit(seq)), position + 1) - shared
        while True:
            if self.arena.extend(region, need):
                return True
            move = self.arena.relocate(region, need)
            if move is not None:
                self.moves.append(move)
                return True
            if self._evict(set()):
                continue
            if self.arena.free_tokens() >= aligned(need) > self.arena.largest_hole():
                self._compact()
                continue
            victim = self._victim(seq, growing=True)
            if victim is None:
                return False
            self._m[3].inc()
            preempt(victim)
            if victim is seq:
                return False

    def _ahead(self) -> int:
        """The look-ahead a joining or growing region is given now: LOOKAHEAD while the arena (free and
        evictable) has that much for every holder and one more, else SHORT_LOOKAHEAD: where memory is short,
        what sequences hold unwritten is what keeps others waiting (SmolLM2 chats in a budget they overfill:
        0.82 of what the written tokens would fit with 32 tokens ahead each, 0.89 with one block on growing
        alone), and growth is then planned every 16 steps instead of 32."""
        room = self.arena.capacity - self.arena.reserved()
        return self.lookahead if room >= self.lookahead * (len(self._holders) + 1) else self.short_lookahead

    def prefilled(self, seq: GenSequence) -> None:
        """Its feed is in: the prompt's blocks may serve later requests."""
        if seq.region is not None:
            seq.region.written = seq.position - seq.shared_tokens
            if seq.shared is None:
                self.prefix.register(seq.region, seq.extras.salt, seq.blocks.hashes)

    def wrote(self, seq: GenSequence, token: int) -> None:
        """A decode step wrote `token` (the sequence's last one) at its position - 1."""
        region = seq.region
        if region is not None:
            region.tokens.append(token)
            region.written = seq.position - seq.shared_tokens

    def release(self, seq: GenSequence) -> None:
        """The sequence leaves (finished, cancelled or preempted): what it wrote stays as a cached prefix
        where the cache is on; the rest of its region is free."""
        region, seq.region = seq.region, None
        if region is None:
            return
        del self._holders[id(region)]
        shared, held, seq.shared, seq.shared_tokens = seq.shared, seq.shared_tokens, None, 0
        if shared is not None:
            shared.refs -= 1
            shared.last_used = time.monotonic()
            # A suffix is found by no prompt: the whole is cached where a hole holds it, so the next turn of
            # a chat finds its prompt and its answer (not when preempted: memory is wanted then).
            whole = self._whole(seq, shared, held, region) if region.written and seq.done else None
            self._free(region)
            if whole is not None and self._superseded(shared, held):
                # It holds all the prefix did (whose copy is queued first): kept, the prefix would name the
                # whole's leading blocks, and its eviction (LRU: hits refresh the deepest) hide the whole.
                del self._cached[id(shared)]
                self._free(shared)
            region = whole
        if region is None or not self.prefix.enabled or region.written == 0:
            if region is not None:
                self._free(region)
            return
        self.arena.disown(region)
        region.last_used = time.monotonic()
        self.arena.shrink(region, region.written)
        self.prefix.register(region, seq.extras.salt)
        self._cached[id(region)] = region
        while len(self._cached) > self._max_cached and self._evict(set()):
            pass

    def _superseded(self, shared: Region, held: int) -> bool:
        """A cached prefix no sequence attends, whose registered blocks all lie within `held` tokens."""
        return not shared.refs and id(shared) in self._cached and len(shared.hashes) * ALIGN <= held

    def _whole(self, seq: GenSequence, shared: Region, held: int, own: Region) -> Region | None:
        """A region holding a sharer's prefix and what it wrote (copied before the next step, in order:
        its own region is free at once), where a hole holds it, made by evicting least recently used
        prefixes (never the one it copies) of at most four times its size; else None. Evicting: once the arena
        is full of cached prefixes (any server's steady state), no hole is free, and a chat's next turn
        would find only the turn that was last cached, one turn more behind at every turn."""
        written = held + own.written
        budget = 4 * aligned(written)
        whole = self.arena.allocate(written)
        while whole is None and budget > 0:
            evicted = self._evict({id(shared)})
            if not evicted:
                return None
            budget -= evicted
            whole = self.arena.allocate(written)
        if whole is None:
            return None
        self.moves += [(shared.base, whole.base, held), (own.base, whole.base + held, own.written)]
        whole.tokens, whole.written = array("i", (seq.prompt + seq.produced)[:written]), written
        return whole

    def _reserve(
        self, need: int, seq: GenSequence, keep: set[int], preempt: Callable[[GenSequence], None]
    ) -> Region | None:
        while True:
            region = self.arena.allocate(need)
            if region is not None:
                return region
            if self._evict(keep):
                continue
            if self.arena.free_tokens() >= aligned(need) > self.arena.largest_hole():
                self._compact()
                continue
            victim = self._victim(seq)
            if victim is None:
                return None
            self._m[3].inc()
            preempt(victim)  # gives its region up through release(): cached, evictable next round

    def _compact(self) -> None:
        start = len(self.moves)
        self.moves.extend(self.arena.compact())
        self.compactions.append((start, len(self.moves)))
        self._m[5].inc()

    def _victim(self, seq: GenSequence, *, growing: bool = False) -> GenSequence | None:
        """The running sequence admission ranks lowest, if `seq` outranks it by priority (joining) or is it
        or ranks above it (growing); only one with no prefill chunk in flight or planned this step
        (decoding, or waiting for its next chunk): the step's commit would write into a reset sequence."""
        candidates: Iterable[GenSequence] = (
            s
            for s in self._holders.values()
            if s.planned == s.prefilled and (s.rank <= seq.rank if growing else s.priority < seq.priority)
        )
        return min(candidates, key=lambda s: s.rank, default=None)

    def _evict(self, keep: set[int]) -> int:
        """Frees the least recently used cached prefix not in `keep`: its tokens; 0: there is none."""
        victim = next((key for key, r in self._cached.items() if key not in keep and not r.refs), None)
        if victim is None:
            return 0
        region = self._cached.pop(victim)
        size = region.size
        self._free(region)
        self._m[2].inc()
        return max(size, 1)

    def _free(self, region: Region) -> None:
        self.prefix.forget(region)
        self.arena.free(region)
