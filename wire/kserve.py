"""The v2 stream's error text: ModelStreamInfer reports a refused or failed message in the stream's
`error_message` (Triton's clients raise it for that request), which carries only a string, so the server
writes the canonical code and reason before the message and the shim reads them back for its HTTP status."""

from __future__ import annotations


def stream_error_message(code: str, reason: str, message: str) -> str:
    return f"{code} {reason}: {message}"


def parse_stream_error(text: str) -> tuple[str, str, str]:
    """(code, reason, message); ("UNKNOWN", "", text) for text in another shape."""
    head, sep, message = text.partition(": ")
    code, _, reason = head.partition(" ")
    if not sep or not code.isupper() or not reason.replace("_", "").isupper():
        return "UNKNOWN", "", text
    return code, reason, message
