"""The prefix cache's events (server/kv/events.py publishes them as vLLM's): what it makes findable is one
BlockStored run per register, continuing its chain (the parent is the last block already stored, the salt
on a sequence's first block only); a block another region already holds is not stored twice; forgetting a
region removes exactly the blocks that were found there."""

from __future__ import annotations

from array import array

from server.kv.arena import ALIGN, Region
from server.kv.prefix import PrefixCache


class Recorder:
    """Collects what the cache reports, as the publisher would send it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def stored(
        self, hashes: list[int], parent: int | None, tokens: list[int], salt: str, first: bool
    ) -> None:
        self.events.append(("stored", (list(hashes), parent, list(tokens), salt, first)))

    def removed(self, hashes: list[int]) -> None:
        self.events.append(("removed", list(hashes)))


def region(tokens: list[int], base: int = 0) -> Region:
    return Region(base, len(tokens) + ALIGN, written=len(tokens), tokens=array("i", tokens))


def test_stored_runs_chain_and_removed_names_what_was_found_there() -> None:
    recorder = Recorder()
    cache = PrefixCache(enabled=True, events=recorder)
    prompt = list(range(3 * ALIGN + 5))
    first = region(prompt)
    cache.register(first, "tenant:a")
    ((kind, (hashes, parent, tokens, salt, starts)),) = recorder.events
    assert kind == "stored" and len(hashes) == 3 and parent is None and starts and salt == "tenant:a"
    assert tokens == prompt[: 3 * ALIGN]
    first.tokens.extend(range(100, 100 + ALIGN))  # the sequence wrote one block more
    first.written += ALIGN
    cache.register(first, "tenant:a")
    (kind, (more, parent, tokens, _, starts)) = recorder.events[-1]
    assert (
        len(more) == 1
        and parent == hashes[-1]
        and not starts
        and tokens == first.tokens.tolist()[3 * ALIGN : 4 * ALIGN]
    )
    second = region(prompt[: 2 * ALIGN] + [7] * ALIGN, base=1000)  # shares two blocks with the first
    cache.register(second, "tenant:a")
    (kind, (own, parent, _, _, starts)) = recorder.events[-1]
    assert len(own) == 1 and parent == hashes[1] and not starts  # the shared blocks are the first's
    cache.forget(first)
    assert recorder.events[-1] == ("removed", hashes + more)
    cache.forget(second)
    assert recorder.events[-1] == ("removed", own)  # the two blocks it shared were never found there
