"""The responses kept for `previous_response_id` and `GET /v1/responses/{id}` (`store: true`, OpenAI's
default): in this shim process's memory, as vLLM keeps them, and bounded. An entry lives at most MAX_AGE_S
(an hour), and the store holds at most MAX_ENTRIES responses and MAX_BYTES of their text, the oldest leaving
first; a restart forgets them all, and with `--workers N` each worker holds its own (a chain must come back
to the same process, as vLLM's stored state lives in one replica). An entry is visible only to a request
that shows the token its creator showed (a hash of it is kept; without a keys file every caller is one)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shim import jsonio
from shim.identity import FORWARDED_TOKEN
from shim.openai_responses.conversation import Conversation

MAX_AGE_S = 3600.0
MAX_ENTRIES = 1000
MAX_BYTES = 64 * 2**20


def owner() -> str:
    """Whose the request being served is: a hash of its token (never the token itself), "" without one."""
    token = FORWARDED_TOKEN.get()
    return "" if token is None else hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Stored:
    """One kept response: the object as it was answered, and the conversation a later response continues."""

    owner: str
    response: dict[str, Any]
    conversation: Conversation
    size: int
    expires: float


def _size(response: dict[str, Any], conversation: Conversation) -> int:
    calls = sum(len(c.arguments) + len(c.name) for m in conversation for c in m.tool_calls)
    turns = sum(len(m.content) for m in conversation) + calls
    return len(jsonio.dumps(response)) + turns


class ResponseStore:
    """Kept responses by id, oldest first; `clock` is injectable for the bounds' tests."""

    def __init__(
        self,
        *,
        max_age_s: float = MAX_AGE_S,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age_s, self.max_entries, self.max_bytes = max_age_s, max_entries, max_bytes
        self._clock = clock
        # Keyed by owner too: a response id can be the caller's X-Request-Id, which another token may send.
        self._entries: OrderedDict[tuple[str, str], Stored] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response: dict[str, Any], conversation: Conversation, *, owner: str) -> None:
        """Keeps `response` under its id; one larger than the whole budget is not kept."""
        size = _size(response, conversation)
        if size > self.max_bytes:
            return
        self._expire()
        key = (owner, str(response["id"]))
        self._drop(key)
        self._entries[key] = Stored(owner, response, conversation, size, self._clock() + self.max_age_s)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def get(self, response_id: str, *, owner: str) -> Stored | None:
        """The kept response, if it has not expired and `owner` made it."""
        self._expire()
        return self._entries.get((owner, response_id))

    def delete(self, response_id: str, *, owner: str) -> bool:
        if self.get(response_id, owner=owner) is None:
            return False
        self._drop((owner, response_id))
        return True

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size

    def _expire(self) -> None:
        # Entries are kept in order of insertion, and all live equally long: the expired ones lead.
        now = self._clock()
        while self._entries:
            key, first = next(iter(self._entries.items()))
            if first.expires > now:
                return
            self._drop(key)
