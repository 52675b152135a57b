"""A bounded, deterministic fuzz of the Anthropic and tokenize families (issue 31, acceptance 2), as
test_shim_fuzz.py does for the native routes: random JSON documents, near-valid bodies with hostile values
(blocks of every kind, tools, tool choices, sampling out of range, streams), random and truncated bytes.
No answer may be a 5xx, every error is in its family's shape (Anthropic's, vLLM's), streams are read to
their end, and afterwards nothing is left in flight."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.integration.test_shim_fuzz import (
    FUZZ,
    JSON_HEADERS,
    encode,
    integers,
    json_documents,
    mostly,
    plain_text,
    scalars,
    texts,
    with_extras,
)
from tests.support.processes import ServerProcess, ShimProcess, wait_until

ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
VLLM = ("/tokenize", "/detokenize")

schemas = mostly(
    st.just({"type": "object", "properties": {"city": {"type": "string"}}}),
    json_documents | st.just({"type": "object", "properties": {"x": {"$ref": "#"}}}),
)
tools = with_extras(
    {"name": mostly(st.sampled_from(["get_weather", "f"]), texts), "input_schema": schemas},
    {"description": mostly(plain_text, scalars), "type": mostly(st.just("custom"), texts)},
)
blocks = st.one_of(
    with_extras(
        {"type": st.just("text"), "text": mostly(plain_text, scalars)}, {"cache_control": json_documents}
    ),
    with_extras(
        {
            "type": st.just("tool_use"),
            "id": mostly(plain_text, scalars),
            "name": texts,
            "input": json_documents,
        },
        {},
    ),
    with_extras(
        {"type": st.just("tool_result"), "tool_use_id": mostly(plain_text, scalars)},
        {"content": mostly(plain_text, st.lists(json_documents, max_size=2)), "is_error": scalars},
    ),
    with_extras({"type": mostly(st.sampled_from(["image", "document", "thinking"]), texts)}, {}),
)
messages = st.lists(
    with_extras(
        {
            "role": mostly(st.sampled_from(["user", "assistant"]), texts),
            "content": mostly(plain_text.filter(bool) | st.lists(blocks, min_size=1, max_size=3), scalars),
        },
        {},
    ),
    min_size=1,
    max_size=3,
)
anthropic_bodies = with_extras(
    {
        "model": mostly(st.just("byte-lm"), st.sampled_from(["mlp", "nope", ""]) | texts),
        "messages": mostly(messages, json_documents),
        "max_tokens": mostly(st.integers(1, 6), integers | scalars),
    },
    {
        "system": mostly(plain_text, st.lists(blocks, max_size=2) | scalars),
        "stop_sequences": mostly(st.lists(plain_text.filter(bool), max_size=2), texts | scalars),
        "temperature": mostly(st.floats(0, 1), st.floats(-5, 5) | scalars),
        "top_p": mostly(st.floats(0.01, 1), st.floats(-1, 2) | scalars),
        "top_k": mostly(st.integers(0, 50), integers),
        "stream": mostly(st.booleans(), scalars),
        "tools": mostly(st.lists(tools, max_size=2), json_documents),
        "tool_choice": mostly(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["auto", "any", "tool", "none"])},
                optional={
                    "name": st.sampled_from(["get_weather", "f"]) | texts,
                    "disable_parallel_tool_use": scalars,
                },
            ),
            json_documents,
        ),
        "metadata": mostly(st.fixed_dictionaries({"user_id": plain_text}), json_documents),
        "thinking": mostly(st.just({"type": "disabled"}), json_documents),
    },
)
tokenize_bodies = with_extras(
    {"model": mostly(st.just("byte-lm"), st.sampled_from(["mlp", "nope", ""]) | texts)},
    {
        "prompt": mostly(plain_text, texts | scalars),
        "messages": mostly(
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": plain_text}
                ),
                min_size=1,
                max_size=3,
            ),
            json_documents,
        ),
        "add_special_tokens": mostly(st.booleans(), scalars),
        "add_generation_prompt": mostly(st.booleans(), scalars),
        "tools": mostly(st.just([{"type": "function", "function": {"name": "f"}}]), json_documents),
    },
)
detokenize_bodies = with_extras(
    {
        "model": mostly(st.just("byte-lm"), st.sampled_from(["mlp", "nope", ""]) | texts),
        "tokens": mostly(st.lists(st.integers(0, 300), max_size=8), st.lists(integers, max_size=4) | scalars),
    },
    {},
)
VALID = {
    "/v1/messages": anthropic_bodies,
    "/v1/messages/count_tokens": anthropic_bodies,
    "/tokenize": tokenize_bodies,
    "/detokenize": detokenize_bodies,
}


@pytest.fixture(scope="module")
def http(shim: ShimProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shim.url, timeout=30) as client:
        yield client


def check(http: httpx.Client, path: str, body: bytes) -> None:
    """Posts `body`: below 500 (Anthropic's 529 is an overload, which this run never causes), and an
    error in the family's shape; a stream read to its end ends with message_stop or an error event."""
    with http.stream("POST", path, content=body, headers=JSON_HEADERS) as response:
        content = response.read()
    assert response.status_code < 500, (path, body[:300], content[:500])
    if response.status_code >= 400:
        error = json.loads(content)
        if path in ANTHROPIC:
            assert error["type"] == "error" and set(error["error"]) == {"type", "message"}, content[:500]
        else:
            assert set(error["error"]) == {"message", "type", "param", "code"}, content[:500]
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line for line in content.decode().splitlines() if line.startswith("event: ")]
        assert events[-1] in ("event: message_stop", "event: error"), content[-500:]
    else:
        json.loads(content)


@FUZZ
@given(path=st.sampled_from(sorted(VALID)), document=json_documents)
def test_random_json_documents(http: httpx.Client, path: str, document: Any) -> None:
    check(http, path, encode(document))


@FUZZ
@given(path=st.sampled_from(sorted(VALID)), data=st.data())
def test_near_valid_bodies(http: httpx.Client, path: str, data: st.DataObject) -> None:
    check(http, path, encode(data.draw(VALID[path])))


@FUZZ
@given(path=st.sampled_from(sorted(VALID)), data=st.data())
def test_random_and_truncated_bytes(http: httpx.Client, path: str, data: st.DataObject) -> None:
    whole = encode(data.draw(VALID[path]))
    body = data.draw(st.binary(max_size=64) | st.integers(0, len(whole)).map(lambda end: whole[:end]))
    check(http, path, body)


def test_nothing_is_left_in_flight(http: httpx.Client, server: ServerProcess) -> None:
    wait_until(lambda: http.get("/readyz").json()["inflight"] == 0, what="the shim's in-flight count at 0")
    wait_until(
        lambda: server.metric("sluice_requests_in_flight") == 0, what="the server's in-flight count at 0"
    )
    hello = {"model": "byte-lm", "max_tokens": 3, "messages": [{"role": "user", "content": "ok"}]}
    answer = http.post("/v1/messages", json=hello)
    assert answer.status_code == 200 and answer.json()["usage"]["output_tokens"] >= 1, answer.text
