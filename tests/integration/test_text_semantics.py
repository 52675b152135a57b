"""Issue 4, point 4 over the wire: stop sequences spanning tokens never leak, the streamed text is exactly
the incremental UTF-8 decoding of the tokens (no character broken at a message boundary), usage is exact."""

from __future__ import annotations

from clients import SluiceClient
from tests.support.processes import ServerProcess


def run(server: ServerProcess, prompt: str, **kw: object) -> tuple[str, list[int], str | None, int]:
    with SluiceClient(server.target) as client:
        chunks = list(client.generate("byte-lm", prompt, **kw))  # type: ignore[arg-type]
    usage = chunks[-1].usage
    assert usage is not None
    return (
        "".join(c.text for c in chunks),
        [t for c in chunks for t in c.token_ids],
        chunks[-1].finish_reason,
        usage.completion_tokens,
    )


def test_stop_sequence_spanning_tokens_is_cut_and_never_leaks(server: ServerProcess) -> None:
    text, tokens, reason, _ = run(server, "The story", max_tokens=60, temperature=0.0)
    assert reason == "length"
    stop = text[20:24]  # four one-byte tokens: the stop spans token (and usually message) boundaries
    first = text.index(stop)
    cut, cut_tokens, cut_reason, completion = run(
        server, "The story", max_tokens=60, temperature=0.0, stop=[stop]
    )
    assert cut_reason == "stop"
    assert cut == text[:first]
    assert stop not in cut
    # Usage counts every generated token, including those that formed the (withheld) stop sequence.
    assert completion == len(cut_tokens) == first + len(stop)
    assert cut_tokens == tokens[: first + len(stop)]


def test_streamed_text_is_the_incremental_utf8_decoding_of_the_tokens(server: ServerProcess) -> None:
    # High temperature makes the byte model emit non-ASCII bytes (multi-byte lead and continuation bytes).
    text, tokens, _, completion = run(
        server, "\u00e9t\u00e9 \u65e5\u672c", max_tokens=300, temperature=3.0, seed=11
    )
    assert completion == len(tokens) == 300
    assert any(t >= 128 for t in tokens)
    assert text == bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def test_token_id_prompts_and_text_prompts_agree(server: ServerProcess) -> None:
    by_text = run(server, "h\u00e9llo", max_tokens=10, seed=4)
    with SluiceClient(server.target) as client:
        chunks = list(client.generate("byte-lm", list("h\u00e9llo".encode()), max_tokens=10, seed=4))
    assert [t for c in chunks for t in c.token_ids] == by_text[1]
