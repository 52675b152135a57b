"""Summaries: percentiles of one window, and median with min-max spread across repeats."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of the repeats and their range."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))

    def format(self, digits: int = 0) -> str:
        if self.count == 0:
            return "-"
        body = f"{self.median:.{digits}f}"
        if self.count > 1:
            body += f" [{self.low:.{digits}f}-{self.high:.{digits}f}]"
        return body
