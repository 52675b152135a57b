"""A grammar whose matcher fails mid-stream (issue 36, item 2) ends with an error the caller sees, never as
`stop`: on gRPC the last message has FINISH_REASON_ERROR and the error's code and reason, on the native
routes the `done` event (or the answer) carries them, on the OpenAI routes the stream ends with an error
event and a request that is not streamed is an error response. It is counted by model and reason, what was
streamed before stays sent, and a stream beside it in the same batch is unharmed.

The failure is real, not a mocked matcher: a right-recursive grammar with 50 levels, each of which may
begin with "y", leaves ~50 Earley items per row for every token taken, so the matcher outgrows llguidance's
`max_items_in_row` (2,000) on taking a token its own mask allowed, some 30-40 tokens in."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import grpc
import httpx
import openai
import pytest

from clients import AsyncSluiceClient, Constraint, GenerationChunk
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

LEVELS = 50
RIGHT_RECURSIVE = "\n".join(
    [
        "start: a",
        'a: "x" b0 | "x"',
        *(f'b{i}: b{i + 1} | "y" b{i + 1}' for i in range(LEVELS - 1)),
        f"b{LEVELS - 1}: a",
    ]
)
NO_EOS = {256: -100.0}  # the byte LM's EOS: the grammar may end after any "x", so keep it going
FAILURES = "sluice_constraint_failures_total"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server("--models", "byte-lm")
    yield process
    assert process.terminate() == 0, process.diagnostics()


@pytest.fixture(scope="module")
def shim(server: ServerProcess) -> Iterator[ShimProcess]:
    process = start_shim(server.target)
    yield process
    process.terminate()


def _failures(server: ServerProcess) -> float:
    return server.metric(FAILURES, model="byte-lm", reason="CONSTRAINT_TOO_COMPLEX")


async def _generate(client: AsyncSluiceClient, **kwargs: object) -> list[GenerationChunk]:
    return [chunk async for chunk in client.generate("byte-lm", "x", **kwargs)]  # type: ignore[arg-type]


def test_a_failed_matcher_ends_the_stream_with_an_error_beside_a_healthy_one(server: ServerProcess) -> None:
    """gRPC: the failing stream ends with INVALID_ARGUMENT / CONSTRAINT_TOO_COMPLEX after the tokens it
    streamed (all the grammar's); the stream running beside it gets exactly what it gets alone."""
    healthy = {"max_tokens": 120, "seed": 11, "logit_bias": NO_EOS}

    async def run() -> tuple[list[GenerationChunk], list[GenerationChunk], list[GenerationChunk]]:
        async with AsyncSluiceClient(server.target) as client:
            alone = await _generate(client, **healthy)
            failing, beside = await asyncio.gather(
                _generate(
                    client,
                    constraint=Constraint.grammar(RIGHT_RECURSIVE),
                    max_tokens=500,
                    seed=3,
                    logit_bias=NO_EOS,
                ),
                _generate(client, **healthy),
            )
            return alone, failing, beside

    before = _failures(server)
    alone, failing, beside = asyncio.run(run())
    last = failing[-1]
    assert last.finish_reason == "error", last
    assert last.error is not None
    assert last.error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert last.error.reason == "CONSTRAINT_TOO_COMPLEX"
    assert "max is 2000" in last.error.message
    text = "".join(c.text for c in failing)
    ids = [t for c in failing for t in c.token_ids]
    assert re.fullmatch("x[xy]*", text) and 10 < len(ids) < 100, text  # kept, and never the EOS
    assert last.usage is not None and last.usage.completion_tokens == len(ids)
    assert _failures(server) == before + 1
    assert beside[-1].finish_reason == "length" and beside[-1].error is None
    assert [t for c in beside for t in c.token_ids] == [t for c in alone for t in c.token_ids]


def _native_body(*, stream: bool) -> dict[str, object]:
    return {
        "model": "byte-lm",
        "prompt": "x",
        "max_tokens": 500,
        "seed": 5,
        "logit_bias": {"256": -100},
        "constraint": {"grammar": RIGHT_RECURSIVE},
        "stream": stream,
    }


def _events(response: httpx.Response) -> list[tuple[str, dict[str, object]]]:
    events, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            events.append((name, json.loads(line[6:])))
    return events


def test_the_native_routes_end_with_the_error(server: ServerProcess, shim: ShimProcess) -> None:
    """Native SSE: token events, then the one `done` event with finish_reason "error" and the error; the
    answer that is not streamed carries the same (the family's shape for a generation that ended badly)."""
    before = _failures(server)
    with httpx.stream("POST", f"{shim.url}/v1/generate", json=_native_body(stream=True), timeout=60) as r:
        assert r.status_code == 200
        events = _events(r)
    answer = httpx.post(f"{shim.url}/v1/generate", json=_native_body(stream=False), timeout=60)
    name, done = events[-1]
    assert name == "done" and done["finish_reason"] == "error", events[-1]
    error = done["error"]
    assert isinstance(error, dict) and error["reason"] == "CONSTRAINT_TOO_COMPLEX", error
    streamed = "".join(str(data["text"]) for name, data in events if name == "token")
    assert re.fullmatch("x[xy]*", streamed) and len(streamed) > 10
    assert answer.status_code == 200
    body = answer.json()
    assert body["finish_reason"] == "error" and body["error"]["reason"] == "CONSTRAINT_TOO_COMPLEX", body
    assert body["text"] == streamed  # the same seed: the same tokens before the failure
    assert _failures(server) == before + 2


def test_the_openai_routes_end_with_an_error(server: ServerProcess, shim: ShimProcess) -> None:
    """OpenAI, as vLLM does for an error after a stream began: the stream's last event is an error object
    (after the chunks already sent); a request that is not streamed is an error response (400,
    invalid_request_error, code "constraint_too_complex"), which the SDK raises."""
    client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused", max_retries=0)
    kwargs = {
        "model": "byte-lm",
        "prompt": "x",
        "max_tokens": 500,
        "seed": 5,
        "logit_bias": {"256": -100},
        "extra_body": {"structured_outputs": {"grammar": RIGHT_RECURSIVE}},
    }
    before = _failures(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**kwargs)  # type: ignore[call-overload]
    assert caught.value.code == "constraint_too_complex", caught.value.body
    body = {**kwargs, "stream": True, **kwargs["extra_body"]}  # type: ignore[dict-item]
    del body["extra_body"]
    with httpx.stream("POST", f"{shim.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [data for _, data in _events(r)]
    assert "error" in events[-1], events[-1]
    error = events[-1]["error"]
    assert isinstance(error, dict) and error["code"] == "constraint_too_complex", error
    streamed = "".join(str(e["choices"][0]["text"]) for e in events[:-1] if e.get("choices"))  # type: ignore[index]
    assert re.fullmatch("x[xy]*", streamed) and len(streamed) > 10
    assert _failures(server) == before + 2
