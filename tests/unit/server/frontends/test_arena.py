"""The request ring: bodies placed first in, first out, wrapping, and a segment of their own when full."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from server.frontends.arena import ArenaReader, RequestArena
from server.frontends.wire import INLINE_BYTES, take_body

CHUNK = INLINE_BYTES + 1


@pytest.fixture
def ring() -> Iterator[tuple[RequestArena, ArenaReader]]:
    arena = RequestArena(4 * CHUNK)
    reader = ArenaReader(arena.name)
    yield arena, reader
    reader.close()
    arena.close()


def test_bodies_come_back_intact_and_the_ring_wraps(ring: tuple[RequestArena, ArenaReader]) -> None:
    arena, reader = ring
    for round_ in range(10):  # 10 rounds of 3 bodies in a ring of 4: it wraps every other round
        bodies = [os.urandom(CHUNK) for _ in range(3)]
        placed = [arena.put(b) for b in bodies]
        for body, where in zip(bodies, placed, strict=True):
            assert isinstance(where, tuple) and isinstance(where[0], int), round_
            assert reader.take((where[0], where[1])) == body
            arena.freed()


def test_a_full_ring_hands_out_segments_and_small_bodies_stay_inline(
    ring: tuple[RequestArena, ArenaReader],
) -> None:
    arena, _ = ring
    held = [arena.put(os.urandom(CHUNK)) for _ in range(3)]
    assert all(isinstance(h[0], int) for h in held if isinstance(h, tuple))
    overflow = os.urandom(2 * CHUNK)
    own = arena.put(overflow)
    assert isinstance(own, tuple) and isinstance(own[0], str)  # a segment of its own
    assert take_body((own[0], int(own[1]))) == overflow
    assert arena.put(b"small") == b"small"
    too_big = arena.put(os.urandom(5 * CHUNK))
    assert isinstance(too_big, tuple) and isinstance(too_big[0], str)
    take_body((too_big[0], int(too_big[1])))


def test_the_engine_unlinks_the_ring_of_a_front_end_that_died() -> None:
    arena = RequestArena(2 * CHUNK)
    reader = ArenaReader(arena.name)
    reader.close()  # as on a lost connection
    assert not os.path.exists(f"/dev/shm/{arena.name}")
    arena.close()  # the front end's own close finds it gone: harmless
