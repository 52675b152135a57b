"""ComputeInterval: the GIL switch interval while Infer batches compute (`--infer-switch-interval-ms`).

An eager module (a user's plugin, not a TorchScript trace) gives the GIL up around each of its torch ops
and must win it back from the event loop, which is busiest just then: delivering the last batch's results
and decoding the next calls. A waiting thread asks for the GIL only after a whole switch interval, so each
op of the forward waits that long again (issue 34: ~4 ms of a 17 ms batch-32 MLP forward, loaded, against
one wait for the trace). A shorter interval while a batch computes cuts those waits; the server's own
interval (`--switch-interval-ms`) holds otherwise: byte-lm's Generate at 32 streams made fewer tokens/s
with 0.01 ms throughout (4,900 against 5,000-5,500, loaded), the loop being forced to switch more often.

The interval is one per process, so the windows of every batcher are counted together: the first to open
sets the short interval, the last to close puts back what was there.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import ClassVar


class ComputeInterval:
    """A context manager for the worker thread around one batch's forward pass."""

    # Class-wide: the switch interval is the process's, not a batcher's.
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _open: ClassVar[int] = 0
    _outside_s: ClassVar[float] = 0.0

    def __init__(self, during_s: float) -> None:
        if during_s <= 0:
            raise ValueError("the switch interval must be > 0")
        self.during_s = during_s

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            if cls._open == 0:
                cls._outside_s = sys.getswitchinterval()
                _set(self.during_s)
            cls._open += 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        cls = type(self)
        with cls._lock:
            cls._open -= 1
            if cls._open == 0:
                _set(cls._outside_s)


def _set(seconds: float) -> None:
    """CPython keeps whole microseconds, truncated: setting what it reports (199 us reads 0.000199, which is
    198.99999... us) would lose one each time; half a microsecond over lands on the value itself."""
    sys.setswitchinterval((round(seconds * 1e6) + 0.5) / 1e6)
