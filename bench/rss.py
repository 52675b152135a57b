"""RssSampler: the peak resident-set growth of some processes while a block runs, sampled on a thread."""

from __future__ import annotations

import threading

import psutil


class RssSampler:
    """Samples the resident set of some processes on a thread; peak growth over the starting value."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.05) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.start = {name: p.memory_info().rss for name, p in self.procs.items()}
        self.peak = dict(self.start)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, proc in self.procs.items():
                self.peak[name] = max(self.peak[name], proc.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def growth_mb(self) -> dict[str, float]:
        return {name: (self.peak[name] - self.start[name]) / 1e6 for name in self.procs}
