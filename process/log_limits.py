"""RepeatFilter: a logging filter that lets through the first few records of each kind per window and
counts the rest, so a failure that repeats every few milliseconds (a probe at its descriptor limit, an
accept loop out of resources) cannot fill the disk. The next record let through says how many were dropped.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Window:
    started: float
    passed: int = 0
    dropped: int = 0


class RepeatFilter(logging.Filter):
    """At most `burst` records per (logger, level, message template) every `window_s`; others dropped."""

    def __init__(
        self,
        *,
        burst: int = 5,
        window_s: float = 60.0,
        max_kinds: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if burst < 1 or window_s <= 0 or max_kinds < 1:
            raise ValueError("RepeatFilter needs burst >= 1, window_s > 0 and max_kinds >= 1")
        self.burst = burst
        self.window_s = window_s
        self.max_kinds = max_kinds
        self._clock = clock
        self._windows: OrderedDict[tuple[str, int, str], _Window] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.started >= self.window_s:
            dropped = window.dropped if window is not None else 0
            window = self._windows[key] = _Window(started=now)
            if dropped:
                record.msg = f"{record.msg} [{dropped} similar lines suppressed in the last window]"
        self._windows.move_to_end(key)
        while len(self._windows) > self.max_kinds:  # the kinds themselves are bounded too
            self._windows.popitem(last=False)
        if window.passed >= self.burst:
            window.dropped += 1
            return False
        window.passed += 1
        return True


def install_repeat_filter(
    logger: logging.Logger | None = None, *, burst: int = 5, window_s: float = 60.0
) -> RepeatFilter:
    """Adds one RepeatFilter to every handler of `logger` (the root logger by default): handler filters
    see the records that propagate from every child logger, logger filters only their own."""
    target = logger or logging.getLogger()
    repeat = RepeatFilter(burst=burst, window_s=window_s)
    for handler in target.handlers:
        handler.addFilter(repeat)
    return repeat
