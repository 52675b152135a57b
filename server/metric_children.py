"""Resolved metric children updated with the fewest Python calls, for the per-call hot path (admission).

prometheus_client's public `inc`/`dec`/`observe` check on every update that the metric's labels are
resolved (three Python calls an update; a dozen per Infer). A child resolved once, as admission's are, has
them, so these update its value objects directly: what is exported is the same, update for update
(tests/unit/server/test_metric_children.py compares both ways on one registry). They read
prometheus_client's private attributes, pinned at the version in requirements.lock; that test is what
catches a release that renames them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram


def adder(child: Counter | Gauge) -> Callable[[float], None]:
    """`add(amount)`: the child's inc(amount) (a gauge's dec is add(-amount))."""
    value: Any = child._value
    add: Callable[[float], None] = value.inc
    return add


class Observer:
    """A histogram child's observe(amount), less the per-call label check (no exemplars)."""

    __slots__ = ("_add_sum", "_bounds", "_buckets")

    def __init__(self, child: Histogram) -> None:
        resolved: Any = child
        self._bounds: list[float] = list(resolved._upper_bounds)  # ascending, the last +Inf
        self._buckets: list[Callable[[float], None]] = [bucket.inc for bucket in resolved._buckets]
        self._add_sum: Callable[[float], None] = resolved._sum.inc

    def observe(self, amount: float) -> None:
        self._add_sum(amount)
        bounds = self._bounds
        index = bisect_left(bounds, amount)  # the first bucket whose bound is >= amount, as observe's
        if index < len(bounds) and amount <= bounds[index]:  # NaN lands in none, as in observe
            self._buckets[index](1)
