"""AccessLog: one JSON line per call (method, model, status, reason, queue and compute ms, request id) on
stderr, for a sampled fraction of calls: off by default, `--access-log 1` for every call, `0.01` for one in a
hundred. A call that is not sampled costs one comparison (when off) or one random draw."""

from __future__ import annotations

import json
import logging
import random
import sys
from collections.abc import Callable
from typing import Any, TextIO


class AccessLog:
    def __init__(
        self, rate: float, *, stream: TextIO | None = None, draw: Callable[[], float] = random.random
    ) -> None:
        self.rate = rate
        self._draw = draw
        self._logger = logging.getLogger("sluice.access")
        if rate > 0 and not self._logger.handlers:
            handler = logging.StreamHandler(stream or sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))  # the line is the JSON object alone
            self._logger.addHandler(handler)
            self._logger.setLevel(logging.INFO)
            self._logger.propagate = False  # not through the root handler's prefix and repeat filter

    def sampled(self) -> bool:
        return self.rate > 0 and (self.rate >= 1 or self._draw() < self.rate)

    def write(self, **fields: Any) -> None:
        self._logger.info(json.dumps(fields, separators=(",", ":"), ensure_ascii=False))
