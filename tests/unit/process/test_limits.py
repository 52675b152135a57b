"""The descriptor budget: the soft limit goes up to the hard one; connections stay below it."""

from __future__ import annotations

import resource

import pytest

from process import limits
from process.limits import RESERVED_FDS, FdBudget, raise_fd_limit


def test_the_soft_limit_is_raised_to_the_hard_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"limits": (1024, 20000)}
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _: state["limits"])
    monkeypatch.setattr(limits.resource, "setrlimit", lambda _, value: state.update(limits=value))
    budget = raise_fd_limit()
    assert state["limits"] == (20000, 20000)
    assert (budget.soft, budget.hard, budget.raised_from) == (20000, 20000, 1024)
    assert "raised from 1024" in budget.describe()


def test_a_refused_raise_keeps_the_old_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _: (1024, 4096))

    def refuse(*_: object) -> None:
        raise ValueError("not allowed")

    monkeypatch.setattr(limits.resource, "setrlimit", refuse)
    assert raise_fd_limit().soft == 1024


def test_raising_for_real_leaves_a_usable_limit() -> None:
    budget = raise_fd_limit()
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == budget.soft
    assert budget.connection_cap(None) == budget.soft - RESERVED_FDS


@pytest.mark.parametrize(
    ("requested", "expected"), [(None, 1024 - RESERVED_FDS), (100, 100), (5000, 1024 - RESERVED_FDS)]
)
def test_the_connection_cap_keeps_the_reserve(requested: int | None, expected: int) -> None:
    assert FdBudget(soft=1024, hard=1024, raised_from=1024).connection_cap(requested) == expected
