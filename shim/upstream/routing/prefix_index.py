"""The prefix index of the shim's prefix routing: an approximate record, per replica, of the prompts the
shim sent it, as chained hashes of fixed-size byte blocks (as llm-d's prefix scorer keeps block hashes and
SGLang's router an approximate radix tree of the text). A prompt's blocks hash in a chain seeded with the
model and the tenant's cache salt, so one block's hash stands for the whole prefix up to it, and tenants
whose prefixes the server keeps apart are kept apart here too.

Bounded: each replica keeps at most `capacity` hashes, least recently sent first out (the server's prefix
cache evicts least recently used blocks too, so the two forget in roughly the same order)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sluice.inference.v1 import inference_pb2 as pb

_TOKEN_BYTES = 4


def prompt_bytes(request: pb.GenerateRequest) -> bytes:
    """The request's prompt as bytes that share a prefix wherever the rendered prompts do: a conversation's
    turns in order (role, content, tool calls), separated by bytes no UTF-8 text holds."""
    kind = request.WhichOneof("prompt")
    if kind == "text":
        return request.text.encode()
    if kind == "token_ids":
        return b"".join(i.to_bytes(_TOKEN_BYTES, "little", signed=True) for i in request.token_ids.ids)
    if kind == "chat":
        parts: list[bytes] = []
        for message in request.chat.messages:
            parts.append(message.role.encode() + b"\xff" + message.content.encode())
            for call in message.tool_calls:
                parts.append(b"\xfe" + call.name.encode() + b"\xfe" + call.arguments.encode())
            if message.tool_call_id:
                parts.append(b"\xfd" + message.tool_call_id.encode())
        return b"\xfc".join(parts) + b"\xfc"
    return b""


def block_hashes(data: bytes, *, block_bytes: int, seed: str, max_blocks: int = 4096) -> list[int]:
    """The chained hashes of `data`'s whole blocks, the first `max_blocks` of them (a prefix that long
    already tells conversations apart, and a huge prompt costs the shim no more); a trailing partial block
    is not counted (the server caches whole blocks only). Python's hash is salted per process: the index
    never leaves it."""
    previous = hash(seed)
    hashes: list[int] = []
    end = min(len(data), max_blocks * block_bytes) - block_bytes + 1
    for start in range(0, end, block_bytes):
        previous = hash((previous, data[start : start + block_bytes]))
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Which block hashes each replica was last sent, each replica's set an LRU of at most `capacity`."""

    def __init__(self, replicas: int, *, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]

    def matched(self, hashes: Sequence[int]) -> list[int]:
        """Per replica, how many of the prompt's leading blocks it was sent (a chain: the first miss ends
        the match; a binary search would also do, the walk stops at the first miss anyway)."""
        counts = []
        for held in self._held:
            count = 0
            for value in hashes:
                if value not in held:
                    break
                count += 1
            counts.append(count)
        return counts

    def record(self, replica: int, hashes: Sequence[int]) -> None:
        """`replica` was sent these blocks: they become its most recent, the oldest past capacity go."""
        held = self._held[replica]
        for value in hashes:
            if value in held:
                held.move_to_end(value)
            else:
                held[value] = None
        while len(held) > self.capacity:
            held.popitem(last=False)

    def size(self, replica: int) -> int:
        return len(self._held[replica])
