"""The process's file-descriptor budget: the soft RLIMIT_NOFILE is raised to the hard limit at start-up,
and the connection cap is derived from it with a reserve, so that accept() never runs out of descriptors
(a process at its limit spins on accept errors and every file it opens fails)."""

from __future__ import annotations

import resource
from dataclasses import dataclass

# Descriptors kept for everything that is not a client connection: model files, the metrics port,
# the upstream channel, logs, /proc reads by the memory probe, torch's and grpc's own.
RESERVED_FDS = 256
# Where the hard limit is unlimited, raise the soft limit to this much rather than "infinity".
_UNLIMITED_TARGET = 1 << 20


@dataclass(frozen=True, slots=True)
class FdBudget:
    soft: int
    hard: int
    raised_from: int

    def connection_cap(self, requested: int | None) -> int:
        """The most client connections to hold: `requested` (None: as many as the budget allows), never
        more than the soft limit minus the reserve, and at least 1."""
        most = max(self.soft - RESERVED_FDS, 1)
        return most if requested is None else max(1, min(requested, most))

    def describe(self) -> str:
        raised = f" (raised from {self.raised_from})" if self.raised_from != self.soft else ""
        return f"file descriptors: soft limit {self.soft}{raised}, hard limit {self._hard_text()}"

    def _hard_text(self) -> str:
        return "unlimited" if self.hard == resource.RLIM_INFINITY else str(self.hard)


def raise_fd_limit() -> FdBudget:
    """Raises the soft descriptor limit as far as the hard limit allows; returns the budget in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return FdBudget(soft=soft if soft != resource.RLIM_INFINITY else target, hard=hard, raised_from=soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # a container may forbid it; keep what we have
        return FdBudget(soft=soft, hard=hard, raised_from=soft)
    return FdBudget(soft=target, hard=hard, raised_from=soft)
