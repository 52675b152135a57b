"""RepeatFilter: a record repeated thousands of times reaches the log a bounded number of times."""

from __future__ import annotations

import io
import logging

import pytest

from process.log_limits import RepeatFilter, install_repeat_filter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_logger(name: str) -> tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]:
    stream = io.StringIO()
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(stream))
    clock = Clock()
    repeat = RepeatFilter(burst=3, window_s=10.0, clock=clock)
    logger.handlers[0].addFilter(repeat)
    return logger, stream, repeat, clock


def test_a_flood_of_one_message_is_cut_to_the_burst_and_the_drop_is_reported() -> None:
    logger, stream, _, clock = make_logger("test.flood")
    for i in range(10_000):
        logger.error("accept() out of system resource (%d)", i)
    lines = stream.getvalue().splitlines()
    assert lines == [f"accept() out of system resource ({i})" for i in range(3)]
    clock.now = 10.0
    logger.error("accept() out of system resource (%d)", 10_000)
    last = stream.getvalue().splitlines()[-1]
    assert last.endswith("(10000) [9997 similar lines suppressed in the last window]")


def test_different_messages_and_levels_have_their_own_budget() -> None:
    logger, stream, _, _ = make_logger("test.kinds")
    for _ in range(5):
        logger.error("probe failed")
        logger.warning("probe failed")
        logger.error("other failure")
    assert len(stream.getvalue().splitlines()) == 9


def test_the_kinds_remembered_are_bounded() -> None:
    repeat = RepeatFilter(burst=1, window_s=10.0, max_kinds=4, clock=Clock())
    for i in range(100):
        repeat.filter(logging.LogRecord("x", logging.ERROR, __file__, 1, f"message {i}", None, None))
    assert len(repeat._windows) == 4


def test_install_puts_the_filter_on_every_root_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    handlers = [logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())]
    monkeypatch.setattr(root, "handlers", handlers)
    repeat = install_repeat_filter(burst=2)
    assert all(repeat in handler.filters for handler in handlers)


def test_nonsense_options_are_refused() -> None:
    with pytest.raises(ValueError, match="burst"):
        RepeatFilter(burst=0)
