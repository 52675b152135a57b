"""KV events: the prefix cache's changes published as vLLM publishes them (vllm/distributed/kv_events.py),
so that a router keeping an exact index of each replica's cache (llm-d's precise-prefix scorer, the shim
where it is configured to) can read Sluice's: `--kv-events-endpoint` (a ZMQ PUB socket) and
`--kv-events-replay-endpoint` (a ROUTER socket that resends what a subscriber missed).

Each message is ZMQ multipart [topic, sequence number (8 bytes, big-endian), payload]; the topic is
`kv@<host>@<model>` (llm-d's form). The payload is msgpack of vLLM's array-like EventBatch, [ts, events],
each event a tagged array:
- ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  extra_keys]: blocks of `block_size` (server/kv/arena.py ALIGN) tokens became findable; `token_ids`
  are theirs in order; a block's hash chains every token before it and the tenant's cache salt, which
  `extra_keys` carries on the sequence's first block (as vLLM's does: `(salt,)`, else None);
- ["BlockRemoved", block_hashes, medium]: evicted or freed, no longer found;
- ["AllBlocksCleared"]: sent once at start: a subscriber drops what it knew of an earlier process.
Hashes are Python's (salted per process, consistent within it, as a subscriber needs: it matches a
BlockRemoved against the BlockStored it saw). Replay: a request of 8 bytes (the first sequence number
wanted) is answered by every buffered [sequence, payload] from there, then [-1, b""].

The scheduler only appends to a queue; one thread encodes and sends, so no ZMQ call is made on the loop."""

from __future__ import annotations

import collections
import logging
import queue
import socket
import threading
import time
from typing import Any

import msgpack  # type: ignore[import-untyped]
import zmq

from server.kv.arena import ALIGN

_log = logging.getLogger("sluice.kv")
_REPLAY_BUFFER = 10_000  # batches kept for replay
_END = (-1).to_bytes(8, "big", signed=True)
_Event = list[Any]


class KvEventPublisher:
    """One per process: the sockets, the sequence numbers and the replay buffer, on a thread of its own."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None) -> None:
        self._queue: queue.SimpleQueue[tuple[bytes, list[_Event]] | None] = queue.SimpleQueue()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.bind(endpoint)
        self._replay = None
        if replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=_REPLAY_BUFFER)
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        _log.info("KV events on %s (replay: %s)", endpoint, replay_endpoint or "none")

    def sink(self, model: str, device: str) -> KvEventSink:
        return KvEventSink(
            self, f"kv@{socket.gethostname()}@{model}".encode(), "GPU" if device == "cuda" else "CPU"
        )

    def send(self, topic: bytes, events: list[_Event]) -> None:
        self._queue.put((topic, events))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)
        self._context.destroy(linger=0)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.02)
            except queue.Empty:
                item = ()  # type: ignore[assignment]  # nothing to send: answer replays
            if item is None:
                return
            if item:
                topic, events = item
                payload = msgpack.packb([time.time(), events])
                self._buffer.append((self._sequence, payload))
                self._pub.send_multipart([topic, self._sequence.to_bytes(8, "big", signed=True), payload])
                self._sequence += 1
            if self._replay is not None and self._replay.poll(0):
                self._answer_replay(self._replay)

    def _answer_replay(self, router: zmq.Socket[bytes]) -> None:
        identity, *frames = router.recv_multipart()
        start = int.from_bytes(frames[-1], "big", signed=True) if frames and len(frames[-1]) == 8 else 0
        for number, payload in list(self._buffer):
            if number >= start:
                router.send_multipart([identity, b"", number.to_bytes(8, "big", signed=True), payload])
        router.send_multipart([identity, b"", _END, b""])


class KvEventSink:
    """One model's events, as the prefix cache reports them."""

    def __init__(self, publisher: KvEventPublisher, topic: bytes, medium: str) -> None:
        self.publisher, self.topic, self.medium = publisher, topic, medium
        publisher.send(topic, [["AllBlocksCleared"]])

    def stored(
        self, hashes: list[int], parent: int | None, tokens: list[int], salt: str, first: bool
    ) -> None:
        """Blocks of `tokens` (whole blocks, in order) became findable; `first`: they begin a sequence."""
        extra: list[Any] = [None] * len(hashes)
        if first and salt and extra:
            extra[0] = [salt]
        event = ["BlockStored", hashes, parent, tokens, ALIGN, None, self.medium, None, extra]
        self.publisher.send(self.topic, [event])

    def removed(self, hashes: list[int]) -> None:
        if hashes:
            self.publisher.send(self.topic, [["BlockRemoved", hashes, self.medium]])


_publishers: dict[tuple[str, str | None], KvEventPublisher] = {}


def publisher(endpoint: str, replay_endpoint: str | None) -> KvEventPublisher:
    """The process's publisher for these endpoints (every model and device of a server shares one)."""
    key = (endpoint, replay_endpoint)
    if key not in _publishers:
        _publishers[key] = KvEventPublisher(endpoint, replay_endpoint)
    return _publishers[key]
