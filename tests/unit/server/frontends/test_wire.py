"""The front-end records: framing split anywhere, and bodies over the inline limit through shared memory."""

from __future__ import annotations

import os
from typing import Any

import pytest

from server.frontends.wire import INLINE_BYTES, RecordReader, drop_body, frame, put_body, take_body


def test_records_arrive_whole_however_the_bytes_are_split() -> None:
    records: list[tuple[Any, ...]] = []
    reader = RecordReader(records.append, lambda _: None)
    sent = [(2, 1, "/a/B", (("k", "v"), ("k-bin", b"\x00")), None, b"x" * 300), (3, 1), (4, 7)]
    stream = b"".join(frame(r) for r in sent)
    for size in (1, 3, 7, len(stream)):
        records.clear()
        for start in range(0, len(stream), size):
            reader.data_received(stream[start : start + size])
        assert records == sent


def test_a_small_body_travels_inline() -> None:
    data = b"y" * INLINE_BYTES
    assert put_body(data) is data
    assert take_body(data) == data


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("sluice-")}


def test_a_large_body_goes_through_shared_memory_read_once_and_unlinked() -> None:
    # Only this body's segment is looked at: other processes' arenas (a parallel test worker's front ends)
    # come and go in /dev/shm meanwhile.
    data = os.urandom(INLINE_BYTES + 1)
    body = put_body(data)
    assert isinstance(body, tuple) and body[1] == len(data)
    assert body[0] in _segments()
    assert take_body(body) == data
    assert body[0] not in _segments()
    with pytest.raises(FileNotFoundError):
        take_body(body)


def test_a_body_nobody_reads_is_dropped() -> None:
    before = _segments()
    body = put_body(b"z" * (2 * INLINE_BYTES))
    drop_body(body)
    drop_body(body)  # twice is harmless: the reader may have been first
    assert _segments() == before
