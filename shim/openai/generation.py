"""The Generate calls behind one OpenAI request (n per prompt), and what they produce as choices: collected
whole, or streamed piece by piece. A call is read only as fast as the client takes its events, so
back-pressure reaches the server through gRPC flow control; closing cancels every call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import finish_reason_name
from shim.errors import ErrorBody, from_rpc_error, from_stream_error, upstream_protocol_error
from shim.stream import sse
from shim.stream.paced import HEARTBEAT, PacedStream
from shim.upstream.channel import Upstream

GenerateCall = grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]
_ENDED_EARLY = "the upstream ended the generation without a final message"


@dataclass(slots=True)
class Piece:
    """New output of one choice; the last piece of a choice has its finish_reason (and usage)."""

    index: int
    text: str = ""
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    usage: pb.Usage | None = None
    error: ErrorBody | None = None

    @classmethod
    def of(cls, index: int, message: pb.GenerateResponse) -> Piece:
        finish = finish_reason_name(message.finish_reason)
        error = None
        if message.HasField("error"):
            error = from_stream_error(message.error.code, message.error.message, message.error.reason)
        return cls(
            index,
            message.text,
            list(message.logprobs),
            finish,
            message.usage if finish is not None else None,
            error,
        )


@dataclass(slots=True)
class Choice:
    """A whole choice, collected."""

    index: int
    text: str
    logprobs: list[pb.TokenLogprob]
    finish_reason: str
    usage: pb.Usage
    error: ErrorBody | None


class Generations:
    """n calls started together; `start()` waits for every call's first message, so that a call refused or
    invalid becomes an HTTP error before any 200 is sent."""

    def __init__(
        self,
        upstream: Upstream,
        requests: Sequence[pb.GenerateRequest],
        *,
        timeout_s: float,
        metadata: tuple[tuple[str, str], ...],
        reconnect_s: float,
    ) -> None:
        self.calls: list[GenerateCall] = [
            upstream.inference.Generate(request, timeout=timeout_s, metadata=metadata) for request in requests
        ]
        self.reconnect_s = reconnect_s
        self._first: list[pb.GenerateResponse] = []

    async def start(self) -> None:
        """Raises the first call's AioRpcError (for the route's upstream_errors) or a protocol error."""
        for message in await asyncio.gather(*(call.read() for call in self.calls)):
            if not isinstance(message, pb.GenerateResponse):
                raise upstream_protocol_error(_ENDED_EARLY)
            self._first.append(message)

    def cancel(self) -> None:
        for call in self.calls:
            call.cancel()

    async def collect(self) -> list[Choice]:
        return list(await asyncio.gather(*(self._collect(i) for i in range(len(self.calls)))))

    async def _collect(self, index: int) -> Choice:
        texts: list[str] = []
        logprobs: list[pb.TokenLogprob] = []
        message: pb.GenerateResponse | grpc.aio.EOFType = self._first[index]
        while isinstance(message, pb.GenerateResponse):
            piece = Piece.of(index, message)
            texts.append(piece.text)
            logprobs.extend(piece.logprobs)
            if piece.finish_reason is not None and piece.usage is not None:
                return Choice(index, "".join(texts), logprobs, piece.finish_reason, piece.usage, piece.error)
            message = await self.calls[index].read()
        raise upstream_protocol_error(_ENDED_EARLY)

    async def pieces(self, *, heartbeat_s: float) -> AsyncIterator[Piece | bytes]:
        """Every choice's pieces as they come (an SSE heartbeat, as bytes, for every quiet interval); a call
        that fails ends its choice with a piece carrying the error. The caller's `finally` calls cancel()."""
        if len(self.calls) == 1:
            async for item in self._single(heartbeat_s):
                yield item
            return
        queue: asyncio.Queue[Piece] = asyncio.Queue(maxsize=len(self.calls))
        readers = [asyncio.ensure_future(self._feed(i, queue)) for i in range(len(self.calls))]
        open_choices = len(self.calls)
        pending: asyncio.Future[Piece] | None = None
        try:
            while open_choices:
                pending = asyncio.ensure_future(queue.get())
                async for ping in sse.heartbeats_until(pending, interval_s=heartbeat_s):
                    yield ping
                piece = pending.result()
                if piece.finish_reason is not None or piece.error is not None:
                    open_choices -= 1
                yield piece
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
            for reader in readers:
                reader.cancel()

    async def _single(self, heartbeat_s: float) -> AsyncIterator[Piece | bytes]:
        message = self._first[0]
        stream = PacedStream(self.calls[0], heartbeat_s=heartbeat_s)
        try:
            while True:
                piece = Piece.of(0, message)
                yield piece
                if piece.finish_reason is not None:
                    return
                try:
                    while (received := await stream.next()) is HEARTBEAT:
                        yield sse.PING
                except grpc.aio.AioRpcError as exc:
                    yield Piece(0, error=from_rpc_error(exc, reconnect_s=self.reconnect_s).body)
                    return
                if not isinstance(received, pb.GenerateResponse):
                    yield Piece(0, error=upstream_protocol_error(_ENDED_EARLY).body)
                    return
                message = received
        finally:
            stream.close()

    async def _feed(self, index: int, queue: asyncio.Queue[Piece]) -> None:
        """Reads one call into the queue; a full queue stops the reading, and so the server."""
        message: pb.GenerateResponse | grpc.aio.EOFType = self._first[index]
        try:
            while isinstance(message, pb.GenerateResponse):
                piece = Piece.of(index, message)
                await queue.put(piece)
                if piece.finish_reason is not None:
                    return
                message = await self.calls[index].read()
            await queue.put(Piece(index, error=upstream_protocol_error(_ENDED_EARLY).body))
        except grpc.aio.AioRpcError as exc:
            await queue.put(Piece(index, error=from_rpc_error(exc, reconnect_s=self.reconnect_s).body))


def token_text(token: bytes) -> str:
    """A token's text for log-probability listings: a token holding part of a character shows U+FFFD."""
    return token.decode("utf-8", errors="replace")
