"""What a request asks of its upstream call beyond the message: its priority (body field, else the
`X-Sluice-Priority` header) and its deadline (the route default, shortened by `X-Sluice-Timeout-Ms`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from starlette.datastructures import Headers

from clients.types import PriorityName
from shim.errors import FieldViolation
from shim.refusals import invalid_argument
from wire import metadata as names

PRIORITY_HEADER = names.PRIORITY_HEADER
TIMEOUT_HEADER = names.TIMEOUT_HEADER


@dataclass(frozen=True, slots=True)
class CallOptions:
    priority: PriorityName | None
    timeout_s: float


def _header_error(header: str, message: str) -> Exception:
    return invalid_argument(message, reason="INVALID_HEADER", violations=(FieldViolation(header, message),))


_PRIORITY_NAMES: tuple[PriorityName, ...] = get_args(PriorityName)


def priority_from(body_priority: PriorityName | None, headers: Headers) -> PriorityName | None:
    """The body's priority wins over the header, which wins over the server's default (None)."""
    if body_priority is not None:
        return body_priority
    header = headers.get(PRIORITY_HEADER)
    if header is None:
        return None
    for name in _PRIORITY_NAMES:
        if header.strip().lower() == name:
            return name
    raise _header_error("X-Sluice-Priority", f"X-Sluice-Priority must be low, normal or high, not {header!r}")


def timeout_from(default_s: float, headers: Headers) -> float:
    """The caller may only shorten the shim's deadline, never extend it."""
    header = headers.get(TIMEOUT_HEADER)
    if header is None:
        return default_s
    try:
        requested_ms = int(header)
    except ValueError:
        requested_ms = 0
    if requested_ms <= 0:
        raise _header_error(
            "X-Sluice-Timeout-Ms", f"X-Sluice-Timeout-Ms must be a positive integer, not {header!r}"
        )
    return min(default_s, requested_ms / 1000.0)


def call_options(
    body_priority: PriorityName | None, headers: Headers, *, default_timeout_s: float
) -> CallOptions:
    return CallOptions(
        priority=priority_from(body_priority, headers), timeout_s=timeout_from(default_timeout_s, headers)
    )
