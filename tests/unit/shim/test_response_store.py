"""The Responses family's store (shim/openai_responses/store.py): an entry lives at most its age, the store
keeps at most its count and its bytes (the oldest leave first), an entry is seen only by its owner, and one
larger than the whole budget is not kept."""

from __future__ import annotations

from typing import Any

from clients.types import ChatMessage
from shim.openai_responses.store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def response(response_id: str, text: str = "") -> dict[str, Any]:
    return {"id": response_id, "object": "response", "output_text": text}


def test_an_entry_expires_after_its_age() -> None:
    clock = Clock()
    store = ResponseStore(max_age_s=10, clock=clock)
    store.put(response("a"), (ChatMessage("user", "hi"),), owner="")
    clock.now = 9.9
    kept = store.get("a", owner="")
    assert kept is not None and kept.conversation == (ChatMessage("user", "hi"),)
    clock.now = 10.0
    assert store.get("a", owner="") is None and len(store) == 0 and store.bytes == 0


def test_the_oldest_leave_first_past_the_count_or_the_bytes() -> None:
    store = ResponseStore(max_entries=2)
    for name in "abc":
        store.put(response(name), (), owner="")
    assert [store.get(n, owner="") is not None for n in "abc"] == [False, True, True]
    one = len(str(response("x", "y" * 100)))  # about one entry's bytes
    store = ResponseStore(max_bytes=3 * one)
    for name in "abcd":
        store.put(response(name, "y" * 100), (), owner="")
    assert store.get("a", owner="") is None and store.get("d", owner="") is not None
    assert store.bytes <= 3 * one
    store.put(response("huge", "y" * 4 * one), (), owner="")  # larger than the whole budget: not kept
    assert store.get("huge", owner="") is None and store.get("d", owner="") is not None


def test_an_entry_is_seen_and_deleted_only_by_its_owner() -> None:
    store = ResponseStore()
    store.put(response("a"), (), owner="alice")
    assert store.get("a", owner="bob") is None and not store.delete("a", owner="bob")
    assert store.get("a", owner="alice") is not None
    assert store.delete("a", owner="alice") and store.get("a", owner="alice") is None


def test_one_id_under_two_owners_is_two_entries() -> None:
    """A response id can be a caller's X-Request-Id: another token sending the same one replaces nothing."""
    store = ResponseStore()
    store.put(response("a", "alice's"), (), owner="alice")
    store.put(response("a", "bob's"), (), owner="bob")
    alices, bobs = store.get("a", owner="alice"), store.get("a", owner="bob")
    assert alices is not None and alices.response["output_text"] == "alice's"
    assert bobs is not None and bobs.response["output_text"] == "bob's"


def test_a_response_stored_again_replaces_the_first() -> None:
    store = ResponseStore()
    store.put(response("a", "one"), (), owner="")
    store.put(response("a", "two"), (), owner="")
    kept = store.get("a", owner="")
    assert len(store) == 1 and kept is not None and kept.response["output_text"] == "two"
