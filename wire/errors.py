"""Error domains and reasons (google.rpc.ErrorInfo, AIP-193), and the clip rule for values an error echoes.

Reasons are UPPER_SNAKE and stable: callers branch on them. The server's go with DOMAIN, the shim's own
(refusals before a call reaches the server) with SHIM_DOMAIN.
"""

from __future__ import annotations

DOMAIN = "sluice.inference.v1"
SHIM_DOMAIN = "shim.sluice"

# -- the server's reasons -----------------------------------------------------------------------------
INTERNAL = "INTERNAL"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
WRONG_METHOD = "WRONG_METHOD"
REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
QUEUE_FULL = "QUEUE_FULL"
REQUEST_BYTES = "REQUEST_BYTES"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
MEMORY_PRESSURE = "MEMORY_PRESSURE"
SHUTTING_DOWN = "SHUTTING_DOWN"
NOT_READY = "NOT_READY"
DEADLINE_EXPIRED = "DEADLINE_EXPIRED"
DEADLINE_UNMEETABLE = "DEADLINE_UNMEETABLE"
STALLED_CONSUMER = "STALLED_CONSUMER"
UNAUTHENTICATED = "UNAUTHENTICATED"
MODEL_NOT_ALLOWED = "MODEL_NOT_ALLOWED"
TENANT_QUOTA = "TENANT_QUOTA"
MODEL_ERROR = "MODEL_ERROR"
CONSTRAINT_TOO_COMPLEX = "CONSTRAINT_TOO_COMPLEX"
CONSTRAINT_FAILED = "CONSTRAINT_FAILED"
#: A part of the protocol this server was not started with (KServe v2 system shared memory: --kserve-shm).
FEATURE_OFF = "FEATURE_OFF"
#: Shared memory asked for by a caller that is not on the server's host (its peer is not loopback or Unix).
SHM_NOT_LOCAL = "SHM_NOT_LOCAL"
#: A shared-memory object outside the caller's name prefix, or not a plain object of its own.
SHM_KEY_NOT_ALLOWED = "SHM_KEY_NOT_ALLOWED"
#: The caller's registered regions would pass its count or byte cap (--kserve-shm-max-*).
SHM_QUOTA = "SHM_QUOTA"

# -- the shim's reasons -------------------------------------------------------------------------------
UPSTREAM_UNAVAILABLE = "UPSTREAM_UNAVAILABLE"
UPSTREAM_PROTOCOL_ERROR = "UPSTREAM_PROTOCOL_ERROR"
MALFORMED_JSON = "MALFORMED_JSON"
MALFORMED_HTTP = "MALFORMED_HTTP"
REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
SHIM_OVERLOADED = "SHIM_OVERLOADED"

#: The most characters of a caller's value that an error message or metadata value repeats.
ECHO_LIMIT = 64


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """`value` as text an error may echo: cut to `limit` characters with a marker that gives the original
    length, and encodable as UTF-8 (a lone surrogate, as a JSON escape like "\\udc80" makes, is escaped)."""
    text = str(value)
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} chars)"
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
