"""TextAssembler: split UTF-8 characters are never emitted broken; stop sequences never leak."""

from __future__ import annotations

from server.batching.text import TextAssembler


def stream(data: bytes, stop: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    assembler, pieces = TextAssembler(stop), []
    for byte in data:
        text, stopped = assembler.feed(bytes([byte]))
        pieces.append(text)
        if stopped:
            return pieces, True
    pieces.append(assembler.flush())
    return pieces, False


def test_multibyte_characters_split_across_tokens_come_out_whole() -> None:
    pieces, _ = stream("naïve 日本 🙂".encode())
    assert "".join(pieces) == "naïve 日本 🙂"
    assert all(p.encode("utf-8").decode("utf-8") == p and "\ufffd" not in p for p in pieces)
    assert "🙂" in pieces  # emitted at once when its fourth byte arrives, not byte by byte


def test_stop_sequence_spanning_tokens_is_withheld() -> None:
    pieces, stopped = stream(b"hello STOP there", stop=("STOP",))
    assert stopped and "".join(pieces) == "hello "
    assert not any("S" in p for p in pieces)


def test_partial_stop_prefix_is_released_when_it_turns_out_not_to_stop() -> None:
    pieces, stopped = stream(b"a STO b", stop=("STOP",))
    assert not stopped and "".join(pieces) == "a STO b"


def test_earliest_of_several_stops_wins() -> None:
    pieces, stopped = stream(b"x <end> y </s>", stop=("</s>", "<end>"))
    assert stopped and "".join(pieces) == "x "


def test_invalid_bytes_become_replacement_characters() -> None:
    pieces, _ = stream(b"ok\xff\xfeok")
    assert "".join(pieces) == "ok\ufffd\ufffdok"


def test_incomplete_character_at_the_end_is_flushed_as_replacement() -> None:
    pieces, _ = stream("é".encode()[:1])
    assert "".join(pieces) == "\ufffd"


def test_a_stop_completing_first_wins_and_overlapping_stops_hold_correctly() -> None:
    pieces, stopped = stream(b"xxabcd", stop=("abcd", "bc"))
    assert stopped and "".join(pieces) == "xxa"  # "bc" completes before "abcd" does
    pieces, stopped = stream(b"aab", stop=("aab",))
    assert stopped and "".join(pieces) == ""  # the failure link keeps "a" of "aa" as a prefix
    pieces, stopped = stream(b"abcabd", stop=("abcabe", "cab"))
    assert stopped and "".join(pieces) == "ab"


def test_stop_matching_agrees_with_a_plain_search() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        stops = tuple("".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(3))
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
        ends = [e for e in range(1, len(text) + 1) if any(text[:e].endswith(s) for s in stops)]
        pieces, stopped = stream(text.encode(), stop=stops)
        if ends:
            first = ends[0]
            longest = max(len(s) for s in stops if text[:first].endswith(s))
            assert stopped and "".join(pieces) == text[: first - longest], (stops, text)
        else:
            assert not stopped and "".join(pieces) == text, (stops, text)


def test_the_cost_per_character_does_not_grow_with_the_number_of_stops() -> None:
    import time

    def cost(count: int) -> float:
        assembler = TextAssembler(tuple(f"stop-{i:06d}" for i in range(count)))
        # This thread's CPU time, not the wall: the cost is the work done, which other processes on a busy
        # machine (a parallel test run) do not change.
        started = time.thread_time()
        for _ in range(2000):
            assembler.feed(b"s")
            assembler.feed(b"x")
        return time.thread_time() - started

    cost(10)  # warm
    few, many = min(cost(4) for _ in range(3)), min(cost(20_000) for _ in range(3))
    assert many < 5 * few, (few, many)


def test_a_stop_completed_before_min_tokens_is_ordinary_text() -> None:
    assembler = TextAssembler(("ab",))
    assert assembler.feed(b"a", may_stop=False) == ("", False)
    assert assembler.feed(b"b", may_stop=False) == ("ab", False)
    assert assembler.feed(b"a") == ("", False)
    assert assembler.feed(b"b") == ("", True)


def test_the_assembler_names_the_stop_sequence_that_completed() -> None:
    for data, stops, named in [
        (b"x <end> y </s>", ("</s>", "<end>"), "<end>"),
        (b"xxabcd", ("abcd", "bc"), "bc"),
        (b"abcabd", ("abcabe", "cab"), "cab"),
        ("café STOP".encode(), ("STOP", "é S"), "é S"),
    ]:
        assembler = TextAssembler(stops)
        assert not assembler.stopped_by
        stopped = False
        for byte in data:
            stopped = assembler.feed(bytes([byte]))[1]
            if stopped:
                break
        assert stopped and assembler.stopped_by == named, data
