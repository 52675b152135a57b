"""The life of one HTTP/1.1 connection: uvicorn's httptools protocol (a C parser: h11 cost ~0.1 ms a
request more) with the timers it lacks, and the pool that caps how many connections the process holds.

uvicorn arms its keep-alive timer only once a response is sent and has no header timeout, so a
connection that sends nothing, or its headers a byte at a time, was held for ever. Each connection is
in one of four phases, followed from the parser's callbacks, and each phase but serving has a
deadline that runs from the phase's start (not from the last byte, which a trickling client renews):

    waiting    no byte of the next request yet (fresh, or kept alive)   closed after idle_timeout_s
    head       part of a request's headers                              408, closed after header_timeout_s
    serving    headers in; the app owns the request (the admission
               middleware bounds the body's size and time)              no deadline here
    draining   answered before the body was read; uvicorn discards it   closed after body_timeout_s

A connection in any phase but serving is reusable: at the cap, a new connection closes the one that
has been reusable longest (as nginx reuses keep-alive connections); only when every held connection is
serving is the new one closed, at once and before any read. So idle sockets can neither exhaust the
descriptors (accept() never meets EMFILE) nor lock a bystander out.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from shim import jsonio
from shim.errors import ShimError
from shim.refusals import malformed_http, request_timeout


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float


class Phase(enum.Enum):
    WAITING = "waiting"
    HEAD = "head"
    SERVING = "serving"
    DRAINING = "draining"


class ConnectionPool:
    """The connections held, and those of them reusable (not serving), oldest first; one loop owns it."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: set[ShimProtocol] = set()
        self._reusable: OrderedDict[ShimProtocol, None] = OrderedDict()

    @property
    def held(self) -> int:
        return len(self._held)

    def admit(self, connection: ShimProtocol) -> bool:
        """Holds `connection`, first closing the longest-reusable one at the cap; False if all serve."""
        if len(self._held) >= self.cap:
            if not self._reusable:
                return False
            oldest, _ = self._reusable.popitem(last=False)
            self._held.discard(oldest)
            oldest.close()
        self._held.add(connection)
        return True

    def mark(self, connection: ShimProtocol, phase: Phase) -> None:
        if phase is Phase.SERVING:
            self._reusable.pop(connection, None)
        elif connection in self._held and connection not in self._reusable:
            self._reusable[connection] = None

    def release(self, connection: ShimProtocol) -> None:
        self._held.discard(connection)
        self._reusable.pop(connection, None)


class ShimProtocol(HttpToolsProtocol):
    """uvicorn's HttpToolsProtocol plus the phase timers and the pool; `protocol_class` binds both."""

    limits: ClassVar[ConnectionLimits]
    pool: ClassVar[ConnectionPool]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: Phase | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._in_head = False  # the parser has begun a request whose headers are not complete
        self._message_done = True  # the current request's body has been read to its end

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.pool.admit(self):
            self._refused = True
            transport.close()
            return
        super().connection_made(transport)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return  # never admitted: uvicorn holds no state for it
        self._cancel_deadline()
        self.pool.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._message_done = True, False

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._message_done = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def send_400_response(self, msg: str) -> None:
        """Bytes the parser cannot read as a request get the error shape too, not uvicorn's plain text."""
        self._answer_and_close(malformed_http(msg))

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _follow(self) -> None:
        """Enters the phase h11's state shows, arming its deadline unless the phase is unchanged."""
        if self.transport.is_closing():
            self._cancel_deadline()
            return
        phase = self._phase_now()
        if phase is self._phase:
            return
        self._phase = phase
        self._cancel_deadline()
        self.pool.mark(self, phase)
        limits = self.limits
        if phase is Phase.WAITING:
            self._deadline = self.loop.call_later(limits.idle_timeout_s, self.close)
        elif phase is Phase.HEAD:
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._headers_too_slow)
        elif phase is Phase.DRAINING:
            self._deadline = self.loop.call_later(limits.body_timeout_s, self.close)

    def _phase_now(self) -> Phase:
        if self._in_head:
            return Phase.HEAD
        if self.cycle is None or self.cycle.response_complete:
            return Phase.WAITING if self._message_done else Phase.DRAINING
        return Phase.SERVING

    def _headers_too_slow(self) -> None:
        self._answer_and_close(request_timeout("headers", self.limits.header_timeout_s))

    def _answer_and_close(self, error: ShimError) -> None:
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = jsonio.dumps(error.to_json())
            head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            self.transport.write(STATUS_LINE[error.status] + head % len(body) + body)
        # Otherwise a response was already under way: closing is all that is left.
        self.transport.close()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def protocol_class(limits: ConnectionLimits) -> type[ShimProtocol]:
    """A ShimProtocol bound to `limits` and a pool of its own, for uvicorn.Config(http=...)."""
    namespace = {"limits": limits, "pool": ConnectionPool(limits.max_connections)}
    return type("BoundShimProtocol", (ShimProtocol,), namespace)
