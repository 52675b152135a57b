"""Issue 31, item 2 and acceptance 1: the official `anthropic` SDK, unchanged, against the real shim and
server. On SmolLM2 (a real answer): a message whole and streamed (the same greedy text, Anthropic's event
sequence, the prefix cache's tokens as cache_read_input_tokens, a stop sequence named), a tool_use /
tool_result round trip, a forced call streamed as input_json_delta, count_tokens equal to what the
message's prompt held. On the seeded byte LM: errors in Anthropic's shape, 529 overloaded_error after the
SDK waited retry-after, x-api-key auth, Anthropic's /v1/models beside OpenAI's, and a stream left early
ending its call."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.prometheus import parse, total
from shim.anthropic.response_models import AnthropicMessage
from tests.support.packages import require
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

# The SDK is imported where it is used, not at collection (tests/support/packages.py).
require("anthropic", "transformers", "gguf")

if TYPE_CHECKING:
    import anthropic

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # SDK 2.x has no temperature argument of its own: the API still takes it
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASKED = [{"role": "user", "content": "What's the weather in Paris?"}]
TOKEN = "anthropic-test-token"


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--models", "byte-lm,smollm2,mlp")
    shim = start_shim(server.target)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


_OPENED: list[anthropic.Anthropic] = []


def client(shim: ShimProcess, **options: Any) -> anthropic.Anthropic:
    import anthropic

    settings: dict[str, Any] = {"api_key": "unused", "max_retries": 0, **options}
    sdk = anthropic.Anthropic(base_url=shim.url, **settings)
    _OPENED.append(sdk)
    return sdk


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def test_smollm2_answers_whole_and_streamed_alike(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    sdk = client(shim)
    whole = sdk.messages.create(model="smollm2", max_tokens=40, messages=CAPITAL, extra_body=GREEDY)  # type: ignore[arg-type]
    AnthropicMessage.model_validate(whole.model_dump())
    assert whole.content[0].type == "text" and "Paris" in whole.content[0].text, whole
    assert whole.stop_reason == "end_turn" and whole.id.startswith("msg_")
    counted = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert counted > 10 and 0 < whole.usage.output_tokens < 40
    with sdk.messages.stream(model="smollm2", max_tokens=40, messages=CAPITAL, extra_body=GREEDY) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert streamed.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == ("end_turn", whole.usage.output_tokens)
    # The same prompt again: the prefix cache held it, and Anthropic counts those apart.
    usage = streamed.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted
    assert (usage.cache_read_input_tokens or 0) > 0


def test_the_raw_stream_is_anthropics_event_sequence(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    body = {"model": "smollm2", "max_tokens": 12, "messages": CAPITAL, "stream": True, **GREEDY}
    kinds: list[str] = []
    data: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{shim.url}/v1/messages", json=body, timeout=60) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: "))
            elif line.startswith("data: "):
                data.append(json.loads(line.removeprefix("data: ")))
    assert [d["type"] for d in data] == kinds  # every event names its type in both places
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) <= {"content_block_delta", "ping"} and "content_block_delta" in kinds
    assert data[0]["message"]["content"] == [] and data[0]["message"]["stop_reason"] is None
    delta = data[-2]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] > 0


def test_a_stop_sequence_is_named_whole_and_streamed(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    sdk = client(shim)
    asked: dict[str, Any] = {"temperature": 0, "stop_sequences": ["Paris"]}
    whole = sdk.messages.create(model="smollm2", max_tokens=40, messages=CAPITAL, extra_body=asked)  # type: ignore[arg-type]
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", "Paris"), whole
    assert "capital of France is" in whole.content[0].text and "Paris" not in whole.content[0].text  # type: ignore[union-attr]
    with sdk.messages.stream(model="smollm2", max_tokens=40, messages=CAPITAL, extra_body=asked) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "Paris")
    assert streamed.content[0].text == whole.content[0].text  # type: ignore[union-attr]


def test_a_tool_use_and_its_result_make_a_round_trip(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    sdk = client(shim)
    tools: Any = [WEATHER]
    called = sdk.messages.create(
        model="smollm2",
        max_tokens=60,
        messages=ASKED,  # type: ignore[arg-type]
        tools=tools,
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    )
    assert called.stop_reason == "tool_use", called
    uses = [block for block in called.content if block.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"})]  # type: ignore[union-attr]
    conversation: Any = [
        *ASKED,
        {"role": "assistant", "content": called.content},  # as the SDK's own examples hand it back
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 24 degrees Celsius"}  # type: ignore[union-attr]
            ],
        },
    ]
    answered = sdk.messages.create(
        model="smollm2", max_tokens=60, messages=conversation, tools=tools, extra_body=GREEDY
    )
    assert answered.stop_reason == "end_turn", answered
    text = answered.content[0].text  # type: ignore[union-attr]
    assert "24" in text and "Paris" in text, text
    # count_tokens: the prompt that message was given, to the token.
    counted = sdk.messages.count_tokens(model="smollm2", messages=conversation, tools=tools)
    usage = answered.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_a_forced_call_streams_its_input_as_json_deltas(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    with client(shim).messages.stream(
        model="smollm2",
        max_tokens=60,
        messages=ASKED,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [("tool_use", {"city": "Paris"})]


def test_count_tokens_is_the_prompt_a_message_is_given(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    sdk = client(shim)
    system = "Answer in one word."
    counted = sdk.messages.count_tokens(model="smollm2", system=system, messages=CAPITAL)  # type: ignore[arg-type]
    whole = sdk.messages.create(model="smollm2", system=system, max_tokens=1, messages=CAPITAL)  # type: ignore[arg-type]
    assert counted.input_tokens == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    bare = sdk.messages.count_tokens(model="smollm2", messages=CAPITAL)  # type: ignore[arg-type]
    assert bare.input_tokens != counted.input_tokens  # SmolLM2's template has a system prompt of its own


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
        ({"temperature": 1.5}, "temperature"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tool_choice": {"type": "any"}}, "tool_choice needs tools"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_in_anthropics_shape(
    stack: tuple[ServerProcess, ShimProcess], extra: dict[str, Any], named: str
) -> None:
    import anthropic

    _, shim = stack
    arguments: dict[str, Any] = {
        "model": "byte-lm",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with pytest.raises(anthropic.BadRequestError) as info:
        client(shim).messages.create(**arguments, extra_body=extra)
    body: Any = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert named in body["error"]["message"], body


def test_an_unknown_model_is_not_found_in_anthropics_shape(stack: tuple[ServerProcess, ShimProcess]) -> None:
    import anthropic

    _, shim = stack
    with pytest.raises(anthropic.NotFoundError) as info:
        client(shim).messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client(shim).messages.count_tokens(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_anthropics_models_list_beside_openais(stack: tuple[ServerProcess, ShimProcess]) -> None:
    import anthropic

    _, shim = stack
    listed = client(shim).models.list()
    assert {m.id for m in listed.data} == {"byte-lm", "smollm2"} and not listed.has_more
    assert client(shim).models.retrieve("smollm2").display_name == "smollm2"
    with pytest.raises(anthropic.NotFoundError):
        client(shim).models.retrieve("mlp")  # a tensor model: not listed, not retrieved
    openai_list = httpx.get(f"{shim.url}/v1/models", timeout=30).json()  # no anthropic-version: OpenAI's
    assert openai_list["object"] == "list" and {m["id"] for m in openai_list["data"]} >= {"byte-lm"}


def test_leaving_a_stream_ends_its_call_on_the_server(stack: tuple[ServerProcess, ShimProcess]) -> None:
    server, shim = stack
    before = server.metric("sluice_tokens_generated_total", model="byte-lm")
    with client(shim).messages.stream(
        model="byte-lm",
        max_tokens=900,
        messages=[{"role": "user", "content": "Tell me a story"}],
        extra_body={"stop_sequences": []},
    ) as stream:
        for index, _ in enumerate(stream.text_stream):
            if index == 5:
                break
    wait_until(
        lambda: server.metric("sluice_sequences_active", model="byte-lm") == 0, what="the sequence gone"
    )
    generated = server.metric("sluice_tokens_generated_total", model="byte-lm") - before
    assert generated < 300, generated
    scraped = parse(httpx.get(f"{shim.url}/metrics", timeout=30).text)
    assert total(scraped, "sluice_shim_requests_total", route="/v1/messages") >= 1  # the route's template


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    path.write_text(f'[[tenant]]\nname = "claude-code"\ntoken_sha256 = "{digest}"\n')
    return path


@pytest.fixture(scope="module")
def full_stack(keys: Path) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--models", "byte-lm", "--max-sequences", "1", "--max-queue", "0")
    shim = start_shim(server.target, "--auth-keys", str(keys))
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


def test_x_api_key_is_the_token(full_stack: tuple[ServerProcess, ShimProcess]) -> None:
    import anthropic

    _, shim = full_stack
    hello: Any = [{"role": "user", "content": "hi"}]
    answer = client(shim, api_key=TOKEN).messages.create(model="byte-lm", max_tokens=2, messages=hello)
    assert answer.usage.output_tokens >= 1
    bearer = anthropic.Anthropic(base_url=shim.url, api_key=None, auth_token=TOKEN, max_retries=0)
    with bearer:
        assert bearer.messages.count_tokens(model="byte-lm", messages=hello).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as info:
        client(shim, api_key="wrong").messages.create(model="byte-lm", max_tokens=2, messages=hello)
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # The tokenize family takes the default headers (Authorization: Bearer, api-key), as vLLM's routes do.
    tokenize = {"model": "byte-lm", "prompt": "hi"}
    refused = httpx.post(f"{shim.url}/tokenize", json=tokenize, headers={"x-api-key": TOKEN}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "AuthenticationError"
    bearer_ok = httpx.post(
        f"{shim.url}/tokenize", json=tokenize, headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert bearer_ok.status_code == 200 and bearer_ok.json()["count"] == 2


def test_an_overloaded_server_is_529_after_the_sdk_waited_as_told(
    full_stack: tuple[ServerProcess, ShimProcess],
) -> None:
    import anthropic

    server, shim = full_stack
    with grpc.insecure_channel(server.target) as channel:
        holder = pb_grpc.InferenceServiceStub(channel).Generate(
            pb.GenerateRequest(model="byte-lm", text="hold", sampling=pb.SamplingParams(max_tokens=900)),
            timeout=60,
            metadata=(("authorization", f"Bearer {TOKEN}"),),
        )
        next(holder)  # admitted: the only slot is held and the queue takes nobody
        refused = server.metric("sluice_requests_refused_total", model="byte-lm", reason="QUEUE_FULL")
        started = time.monotonic()
        with pytest.raises(anthropic.APIStatusError) as info:
            client(shim, api_key=TOKEN, max_retries=1).messages.create(
                model="byte-lm", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
        waited = time.monotonic() - started
        holder.cancel()
    assert info.value.status_code == 529
    assert info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    attempts = server.metric("sluice_requests_refused_total", model="byte-lm", reason="QUEUE_FULL") - refused
    assert attempts == 2  # the first try and the SDK's retry, each refused by the server
    headers = info.value.response.headers
    assert int(headers["retry-after-ms"]) > 0 and int(headers["retry-after"]) >= 1
    assert waited >= int(headers["retry-after-ms"]) / 1000 * 0.9  # the SDK waited the server's delay
