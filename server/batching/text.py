"""Text correctness for streamed tokens: incremental UTF-8 detokenisation and stop-sequence holding.

A multi-byte character split across tokens is held until complete; text that could be the start of a
stop sequence is held until it is known not to be one, so a stop sequence never leaks into the output.
"""

from __future__ import annotations

import codecs


class TextAssembler:
    def __init__(self, stop: tuple[str, ...]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._held = ""

    def feed(self, data: bytes) -> tuple[str, bool]:
        """Adds a token's bytes; returns (text safe to emit now, whether a stop sequence completed)."""
        text = self._held + self._decoder.decode(data)
        if not self._stop:
            self._held = ""
            return text, False
        cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return text[:cut], True
        hold = max((_overlap(text, s) for s in self._stop), default=0)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """Ends the text (not at a stop): releases held text and any incomplete character as U+FFFD."""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0
