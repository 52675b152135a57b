"""H2Peer: a raw HTTP/2 gRPC client that controls its flow-control window, for the tests of peers that read
slowly or never (grpcio's own client always reads ahead). It opens Generate streams on one connection with
a small initial window, grants window only when told to, and records every stream's messages, trailers and
resets as they arrive, on a reader thread.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from sluice.inference.v1 import inference_pb2 as pb

GENERATE = "/sluice.inference.v1.InferenceService/Generate"


@dataclass
class PeerStream:
    """What arrived on one stream: raw DATA bytes (gRPC-framed), then trailers or a reset."""

    stream_id: int
    data: bytearray = field(default_factory=bytearray)
    received: int = 0  # bytes of DATA so far, acknowledged or not
    granted: int = 0  # bytes acknowledged back to the server
    trailers: dict[str, str] | None = None
    reset: int | None = None

    @property
    def ended(self) -> bool:
        return self.trailers is not None or self.reset is not None

    def messages(self) -> list[pb.GenerateResponse]:
        out, pos, raw = [], 0, bytes(self.data)
        while pos + 5 <= len(raw):
            (length,) = struct.unpack(">I", raw[pos + 1 : pos + 5])
            if pos + 5 + length > len(raw):
                break
            out.append(pb.GenerateResponse.FromString(raw[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        return out


class _GoawayKeepsStreams(h2.connection.H2Connection):
    """A GOAWAY stops new streams only; those already open run to their end (RFC 9113, 6.8), which is what a
    draining server relies on. h2 closes the whole connection at once instead (and then fails on the next
    frame): here the connection stays open for the streams that were already running."""

    def _receive_goaway_frame(self, frame: Any) -> Any:
        result = super()._receive_goaway_frame(frame)
        self.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        return result


class H2Peer:
    def __init__(self, port: int, *, window: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.conn = _GoawayKeepsStreams(h2.config.H2Configuration(client_side=True))
        self.conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
        self.conn.initiate_connection()
        self.streams: dict[int, PeerStream] = {}
        self.closed = False
        self._lock = threading.Lock()
        self._flush()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def generate(self, request: pb.GenerateRequest) -> PeerStream:
        body = request.SerializeToString()
        with self._lock:
            stream_id = self.conn.get_next_available_stream_id()
            self.conn.send_headers(
                stream_id,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", GENERATE),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ],
            )
            self.conn.send_data(stream_id, b"\0" + struct.pack(">I", len(body)) + body, end_stream=True)
            stream = self.streams[stream_id] = PeerStream(stream_id)
            self._flush()
        return stream

    def grant(self, stream: PeerStream, size: int | None = None) -> None:
        """Acknowledges up to `size` more received bytes (all when None): that much window reopens."""
        with self._lock:
            size = (
                stream.received - stream.granted
                if size is None
                else min(size, stream.received - stream.granted)
            )
            if size > 0 and not stream.ended:
                self.conn.acknowledge_received_data(size, stream.stream_id)
                stream.granted += size
                self._flush()

    def widen(self, stream: PeerStream, increment: int) -> None:
        """Opens the stream's window beyond what was received: a reader that has room for more."""
        with self._lock:
            if not stream.ended:
                self.conn.increment_flow_control_window(increment, stream.stream_id)
                self.conn.increment_flow_control_window(increment)
                self._flush()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(5)

    def wait(self, predicate: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.01)

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def _read(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                for event in self.conn.receive_data(data):
                    self._on(event)
                try:
                    self._flush()  # ping and settings acknowledgements
                except OSError:
                    return

    def _on(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if stream is None:
            return
        if isinstance(event, h2.events.DataReceived):
            stream.data += event.data
            stream.received += event.flow_controlled_length
        elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
            headers = {k.decode(): v.decode("latin-1") for k, v in event.headers}
            if "grpc-status" in headers:  # a trailers-only answer carries its status in the headers
                stream.trailers = headers
        elif isinstance(event, h2.events.StreamReset):
            stream.reset = event.error_code
