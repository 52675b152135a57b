"""The one consumer of Generate calls, for every API family: the calls behind one HTTP request (one, or n per
prompt) read no faster than the client takes what they produce, so that gRPC flow control holds the server
back, and turned into domain events that a family renders.

    Generations.start()     every call's first message, so that a refusal is an HTTP error, not a 200 stream
    Generations.collect()   each call read whole, as a Choice
    Generations.events()    a Piece per message, HEARTBEAT per quiet interval, and Failed (the call's
                            AioRpcError, or an end without a final message, as an ErrorBody) to end it
    respond()               the route's side: start, then the collected answer or the event stream; a
                            client that leaves, before the stream or during it, cancels every call
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from starlette.requests import Request
from starlette.responses import Response

from clients.codec import finish_reason_name
from shim.errors import ErrorBody, from_rpc_error, from_stream_error, upstream_errors, upstream_protocol_error
from shim.metrics import Timer, metrics_of
from shim.stream.paced import HEARTBEAT, Heartbeat, PacedStream
from shim.stream.sse import EventStreamResponse
from shim.upstream.channel import Upstream
from shim.upstream.disconnect import ClientDisconnected, client_left, unless_disconnected

GenerateCall = grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]
_ENDED_EARLY = "the upstream ended the generation without a final message"
_NO_USAGE = pb.Usage()  # what a piece before the last carries: the usage comes with the final message
_NO_TIMINGS = pb.GenerateTimings()


@dataclass(slots=True)
class Piece:
    """New output of call `index`; its last piece has the finish_reason, the usage, and the error the
    generation ended with, if any (the server sends an error only with the final message)."""

    index: int
    text: str
    token_ids: Sequence[int]
    logprobs: Sequence[pb.TokenLogprob]
    finish_reason: str | None
    usage: pb.Usage
    error: ErrorBody | None
    timings: pb.GenerateTimings  # the server's, on the last piece
    tool_calls: Sequence[pb.ToolCall] = ()  # on the last piece, when finish_reason is tool_calls
    stop_sequence: str = ""  # on the last piece: the request's stop sequence that ended it, if one did

    @classmethod
    def of(cls, index: int, message: pb.GenerateResponse) -> Piece:
        finish = finish_reason_name(message.finish_reason)
        if finish is None:  # the common case, per token: no usage, and an error ends a generation
            return cls(
                index, message.text, message.token_ids, message.logprobs, None, _NO_USAGE, None, _NO_TIMINGS
            )
        error = None
        if message.HasField("error"):
            error = from_stream_error(message.error.code, message.error.message, message.error.reason)
        text, ids, usage, timings = message.text, message.token_ids, message.usage, message.timings
        calls, stop = message.tool_calls, message.stop_sequence
        return cls(index, text, ids, message.logprobs, finish, usage, error, timings, calls, stop)


@dataclass(frozen=True, slots=True)
class Failed:
    """Call `index` failed after its first message; the events end here."""

    index: int
    error: ErrorBody


@dataclass(slots=True)
class Choice:
    """A whole call, collected."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[pb.TokenLogprob]
    finish_reason: str
    usage: pb.Usage
    error: ErrorBody | None
    timings: pb.GenerateTimings
    tool_calls: Sequence[pb.ToolCall] = ()
    stop_sequence: str = ""


Event = Piece | Failed | Heartbeat


class Generations:
    """The Generate calls of one HTTP request, started together; `json_field` renames the server's proto
    paths in their errors to the names the family's callers use."""

    def __init__(
        self,
        upstream: Upstream,
        requests: Sequence[pb.GenerateRequest],
        *,
        timeout_s: float,
        reconnect_s: float,
        metadata: tuple[tuple[str, str], ...] = (),
        json_field: Callable[[str], str] = str,
    ) -> None:
        self.routing = upstream.routing
        self.calls: list[GenerateCall] = [
            upstream.routing.generate(request, timeout=timeout_s, metadata=metadata) for request in requests
        ]
        self.reconnect_s = reconnect_s
        self.json_field = json_field
        self._first: list[pb.GenerateResponse] = []

    async def start(self) -> None:
        """Reads every call's first message; raises the first failed call's AioRpcError (for the route's
        upstream_errors) or a protocol error."""
        if len(self.calls) == 1:  # no gather, and so no task, for the common case
            messages = [await self.calls[0].read()]
        else:
            messages = await asyncio.gather(*(call.read() for call in self.calls))
        for message in messages:
            if not isinstance(message, pb.GenerateResponse):
                raise upstream_protocol_error(_ENDED_EARLY)
            self._first.append(message)

    def cancel(self) -> None:
        for call in self.calls:
            call.cancel()

    async def collect(self) -> list[Choice]:
        """Every call read to its final message (a failed call raises its AioRpcError)."""
        if len(self.calls) == 1:
            return [await self._collect(0)]
        return list(await asyncio.gather(*(self._collect(i) for i in range(len(self.calls)))))

    async def _collect(self, index: int) -> Choice:
        texts: list[str] = []
        token_ids: list[int] = []
        logprobs: list[pb.TokenLogprob] = []
        message: pb.GenerateResponse | grpc.aio.EOFType = self._first[index]
        while isinstance(message, pb.GenerateResponse):
            piece = Piece.of(index, message)
            texts.append(piece.text)
            token_ids.extend(piece.token_ids)
            logprobs.extend(piece.logprobs)
            if piece.finish_reason is not None:
                self.routing.finished(self.calls[index], piece.timings, piece.usage)
                return Choice(
                    index,
                    "".join(texts),
                    token_ids,
                    logprobs,
                    piece.finish_reason,
                    piece.usage,
                    piece.error,
                    piece.timings,
                    piece.tool_calls,
                    piece.stop_sequence,
                )
            message = await self.calls[index].read()
        raise upstream_protocol_error(_ENDED_EARLY)

    async def events(self, *, heartbeat_s: float) -> AsyncIterator[Event]:
        """Every call's pieces as they come, the first messages first; HEARTBEAT for every quiet interval.
        Ends once every call has given its final piece, or with Failed at the first call that fails.
        However it ends (Starlette cancels the body of a client that left) every call is cancelled."""
        stream = PacedStream(self.calls, heartbeat_s=heartbeat_s)
        first = deque(enumerate(self._first))  # read by start(); the stream reads on from there
        finished = [False] * len(self.calls)
        unfinished = len(self.calls)
        try:
            while unfinished:
                item = first.popleft() if first else await stream.next()
                if isinstance(item, Heartbeat):
                    yield HEARTBEAT
                    continue
                index, received = item
                if finished[index]:
                    continue  # what follows a final message: the call's end, read ahead
                if isinstance(received, pb.GenerateResponse):
                    piece = Piece.of(index, received)
                    if piece.finish_reason is not None:
                        self.routing.finished(self.calls[index], piece.timings, piece.usage)
                    yield piece
                    if piece.finish_reason is not None:
                        finished[index] = True
                        unfinished -= 1
                    continue
                if isinstance(received, grpc.aio.AioRpcError):
                    error = from_rpc_error(received, json_field=self.json_field, reconnect_s=self.reconnect_s)
                else:
                    error = upstream_protocol_error(_ENDED_EARLY)
                yield Failed(index, error.body)
                return
        finally:
            stream.close()
            self.cancel()


async def respond(
    request: Request,
    generations: Generations,
    *,
    stream: bool,
    answer: Callable[[list[Choice]], Response],
    events: Callable[[Generations], AsyncIterator[bytes]],
    timed_as: str | None = None,
    media_type: str | None = None,
) -> Response:
    """The HTTP answer to `generations`: a failure before the first messages is the route's HTTP error;
    then `answer(choices)`, or `events(generations)` as an SSE stream (or of `media_type`) that owns the
    calls from then on. `timed_as` names the upstream-latency series the wait for the first messages is
    observed in."""
    handed_off = False
    try:
        with upstream_errors(json_field=generations.json_field, reconnect_s=generations.reconnect_s):
            timer: AbstractContextManager[object] = (
                nullcontext() if timed_as is None else Timer(metrics_of(request), timed_as)
            )
            with timer:
                await unless_disconnected(request, generations.start())
            if not stream:
                return answer(await unless_disconnected(request, generations.collect()))
        handed_off = True
        return EventStreamResponse(events(generations), on_close=generations.cancel, media_type=media_type)
    except ClientDisconnected:
        return client_left(request)
    finally:
        # Until the stream response owns the calls, any exit (error, answer, disconnect) ends them here.
        if not handed_off:
            generations.cancel()
