"""bench/prefix_lookup.py: the lookup's three timings at a prompt length, each a median with its range, on
a cache the prompt hits (the bench refuses to time a lookup that misses)."""

from __future__ import annotations

from bench import prefix_lookup


def test_each_lookup_is_timed_on_a_prompt_that_hits() -> None:
    row = prefix_lookup.measure(2048, repeats=3)
    assert set(row) == {"first", "again", "miss"}
    for spread in row.values():
        assert spread.count == 3 and 0 < spread.low <= spread.median <= spread.high
