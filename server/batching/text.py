"""Text correctness for streamed tokens: incremental UTF-8 detokenisation and stop-sequence holding.

A multi-byte character split across tokens is held until complete; text that could be the start of a
stop sequence is held until it is known not to be one, so a stop sequence never leaks into the output.
The first stop to complete ends the text (the longest, where several complete at the same character).
"""

from __future__ import annotations

import codecs

from server.batching.stops import StopMatcher


class TextAssembler:
    def __init__(self, stop: tuple[str, ...], *, strip_leading_space: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = strip_leading_space
        self._matcher = StopMatcher(stop) if stop else None
        self._state = 0
        self._held = ""
        self.stopped_by = ""  # the stop sequence that completed, once one has

    def feed(self, data: bytes, *, may_stop: bool = True) -> tuple[str, bool]:
        """Adds a token's bytes; returns (text safe to emit now, whether a stop sequence completed). A stop
        that completes while `may_stop` is False (min_tokens not reached) is ordinary text."""
        new = self._decoder.decode(data)
        if self._strip and new:
            # As SentencePiece's decode(): the text's first space is the dummy prefix, not output.
            self._strip = False
            new = new.removeprefix(" ")
        matcher = self._matcher
        if matcher is None:
            return new, False
        state, ends = self._state, matcher.ends
        for index, char in enumerate(new):
            state = matcher.step(state, char)
            if ends[state] and may_stop:
                text = self._held + new[: index + 1]
                self._held = ""
                self.stopped_by = text[len(text) - ends[state] :]
                return text[: len(text) - ends[state]], True
        self._state = state
        text = self._held + new
        # The longest suffix that could still grow into a stop is held back, no more.
        hold = matcher.hold[state]
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """Ends the text (not at a stop): releases held text and any incomplete character as U+FFFD."""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text
