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
