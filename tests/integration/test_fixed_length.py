"""min_tokens and ignore_eos (issue 8, item 6) over gRPC (Python client), the shim's JSON and the Node client:
a stop string or the end-of-sequence token cannot end a stream before min_tokens, and ignore_eos with
min_tokens = max_tokens gives streams of exactly max_tokens tokens, as load tests and benchmarks need."""

from __future__ import annotations

import httpx

from clients import SluiceClient
from tests.integration.test_node_client import node
from tests.integration.test_node_client import pytestmark as node_available
from tests.support.processes import ServerProcess, ShimProcess


def greedy(server: ServerProcess, **kw: object) -> tuple[str, int, str | None]:
    with SluiceClient(server.target) as client:
        chunks = list(client.generate("byte-lm", "Once upon a time", temperature=0.0, **kw))  # type: ignore[arg-type]
    text = "".join(c.text for c in chunks)
    last = chunks[-1]
    assert last.usage is not None
    return text, last.usage.completion_tokens, last.finish_reason


def test_a_stop_cannot_end_the_stream_before_min_tokens(server: ServerProcess) -> None:
    text, _, _ = greedy(server, max_tokens=40)
    stop = text[3]  # a character the greedy stream produces early
    _, early, reason = greedy(server, max_tokens=40, stop=[stop])
    assert reason == "stop" and early <= 4
    _, held, _ = greedy(server, max_tokens=40, stop=[stop], min_tokens=20)
    assert held >= 20


def test_fixed_length_streams_over_every_protocol(server: ServerProcess, shim: ShimProcess) -> None:
    _, tokens, reason = greedy(server, max_tokens=24, min_tokens=24, ignore_eos=True, stop=["e", " "])
    assert (tokens, reason) == (24, "length")
    body = {
        "model": "byte-lm",
        "prompt": "Once upon a time",
        "max_tokens": 24,
        "min_tokens": 24,
        "ignore_eos": True,
        "stop": ["e", " "],
        "temperature": 0.0,
    }
    answer = httpx.post(f"{shim.url}/v1/generate", json=body, timeout=30).json()
    assert (answer["usage"]["completion_tokens"], answer["finish_reason"]) == (24, "length")
    bad = httpx.post(f"{shim.url}/v1/generate", json={**body, "min_tokens": 25}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["field_violations"][0]["field"] == "min_tokens"


@node_available
def test_the_node_client_asks_for_fixed_length_streams(server: ServerProcess) -> None:
    args = ["--max-tokens", "16", "--min-tokens", "16", "--ignore-eos", "--stop", "e", "--temperature", "0"]
    lines = node(server, "generate", "byte-lm", "Once upon a time", *args)
    assert lines[-1]["finish_reason"] == "length"
    assert lines[-1]["usage"]["completion_tokens"] == 16  # type: ignore[index]
