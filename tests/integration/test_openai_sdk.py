"""The official `openai` SDK, sync and async, against the shim (issue 9, acceptance 1): chat streamed and
not (same text for the same seed), completions with n=2 and logprobs, models, refusals with the SDK's own
error types, an overloaded server answered with RateLimitError after the SDK waited the server's delay, and
a stream left early stopping generation on the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import openai
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from shim.openai.response_models import ChatCompletion, Completion, ModelList
from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}]


_OPENED: list[openai.OpenAI] = []


def client(shim: ShimProcess, **options: object) -> openai.OpenAI:
    sdk = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused", **options)  # type: ignore[arg-type]
    _OPENED.append(sdk)
    return sdk


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Each SDK client holds a connection pool: closed here, not left for a later test's garbage collection
    to find (as an unclosed-socket warning)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def test_a_streamed_chat_says_what_the_whole_answer_says(shim: ShimProcess) -> None:
    sdk = client(shim)
    whole = sdk.chat.completions.create(model="byte-lm", messages=MESSAGES, max_tokens=24, seed=11)  # type: ignore[arg-type]
    ChatCompletion.model_validate(whole.model_dump())
    assert whole.choices[0].message.role == "assistant" and whole.usage is not None
    expected = byte_lm_reference.generate(byte_lm_reference.chat_prompt(MESSAGES), 24, seed=11)
    assert whole.choices[0].message.content == byte_lm_reference.text(expected)
    ends = "stop" if expected[-1] == byte_lm_reference.EOS else "length"
    assert (whole.usage.completion_tokens, whole.choices[0].finish_reason) == (len(expected), ends)
    stream = sdk.chat.completions.create(
        model="byte-lm",
        messages=MESSAGES,
        max_tokens=24,
        seed=11,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    # The same counts; only the cached tokens differ (the stream found what the first call left cached).
    counts = {"prompt_tokens_details"}
    assert chunks[-1].usage.model_dump(exclude=counts) == whole.usage.model_dump(exclude=counts)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]


def test_completions_with_two_choices_and_logprobs(shim: ShimProcess) -> None:
    answer = client(shim).completions.create(
        model="byte-lm", prompt="Once upon a time", n=2, logprobs=2, max_tokens=6, seed=3
    )
    Completion.model_validate(answer.model_dump())
    assert [c.index for c in answer.choices] == [0, 1]
    assert answer.choices[0].text != answer.choices[1].text  # seeds 3 and 4
    sampled = [byte_lm_reference.generate("Once upon a time", 6, seed=seed) for seed in (3, 4)]
    assert [c.text for c in answer.choices] == [byte_lm_reference.text(t) for t in sampled]
    for choice in answer.choices:
        logprobs = choice.logprobs
        assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
        assert "".join(logprobs.tokens) == choice.text.replace("\ufffd", "") or len(logprobs.tokens) == 6
        assert all(lp <= 0 for lp in logprobs.token_logprobs)
        # Each chosen token's log-probability under the model (temperature 1: the raw distribution).
        reference = byte_lm_reference.logprobs("Once upon a time", sampled[choice.index])
        assert logprobs.token_logprobs == pytest.approx(reference, abs=1e-4)
        assert logprobs.top_logprobs is not None and all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert (
        answer.usage is not None and answer.usage.prompt_tokens == 16 and answer.usage.completion_tokens == 12
    )


def test_greedy_chat_logprobs_name_the_likeliest_token_first(shim: ShimProcess) -> None:
    answer = client(shim).chat.completions.create(
        model="byte-lm",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,  # type: ignore[arg-type]
    )
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    for entry in content:
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )


def test_models_are_listed_and_unknown_ones_are_not_found(shim: ShimProcess) -> None:
    sdk = client(shim)
    listed = sdk.models.list()
    ModelList.model_validate({"object": "list", "data": [m.model_dump() for m in listed.data]})
    assert {m.id for m in listed.data} >= {"byte-lm", "mlp"}
    assert sdk.models.retrieve("byte-lm").id == "byte-lm"
    with pytest.raises(openai.NotFoundError) as info:
        sdk.models.retrieve("nope")
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"logit_bias": {"1": 200.0}}, "logit_bias.1"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"top_logprobs": 9, "logprobs": True}, "top_logprobs"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    shim: ShimProcess, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(shim, max_retries=0).chat.completions.create(model="byte-lm", messages=MESSAGES, **extra)  # type: ignore[arg-type]
    assert info.value.param == param, info.value.body


def test_the_async_sdk_streams_too(shim: ShimProcess) -> None:
    async def main() -> str:
        sdk = openai.AsyncOpenAI(base_url=f"{shim.url}/v1", api_key="unused")
        async with sdk:
            stream = await sdk.chat.completions.create(
                model="byte-lm", messages=MESSAGES, max_tokens=10, seed=5, stream=True
            )  # type: ignore[arg-type]
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    sync = client(shim).chat.completions.create(model="byte-lm", messages=MESSAGES, max_tokens=10, seed=5)  # type: ignore[arg-type]
    assert asyncio.run(main()) == sync.choices[0].message.content


def test_leaving_a_stream_stops_generation_on_the_server(server: ServerProcess, shim: ShimProcess) -> None:
    before = server.metric("sluice_tokens_generated_total", model="byte-lm")
    stream = client(shim).chat.completions.create(
        model="byte-lm",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=900,
        stream=True,
        extra_body={"ignore_eos": True},  # vLLM's extra: the SDK has no argument of its own for it
    )
    with stream:
        for index, _ in enumerate(stream):
            if index == 5:
                break
    wait_until(
        lambda: server.metric("sluice_sequences_active", model="byte-lm") == 0, what="the sequence gone"
    )
    generated = server.metric("sluice_tokens_generated_total", model="byte-lm") - before
    assert generated < 300, generated  # far from 900: the stop reached the server within a few steps
    assert server.metric("sluice_tokens_after_cancel_total") == 0


@pytest.fixture(scope="module")
def full_stack() -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--models", "byte-lm", "--max-sequences", "1", "--max-queue", "0")
    shim = start_shim(server.target)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


def test_an_overloaded_server_is_a_rate_limit_error_after_the_sdk_waited_as_told(
    full_stack: tuple[ServerProcess, ShimProcess],
) -> None:
    server, shim = full_stack
    with grpc.insecure_channel(server.target) as channel:
        holder = pb_grpc.InferenceServiceStub(channel).Generate(
            pb.GenerateRequest(model="byte-lm", text="hold", sampling=pb.SamplingParams(max_tokens=900)),
            timeout=60,
        )
        next(holder)  # admitted: the only slot is held and the queue takes nobody
        refused = server.metric("sluice_requests_refused_total", model="byte-lm", reason="QUEUE_FULL")
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as info:
            client(shim, max_retries=2).chat.completions.create(model="byte-lm", messages=MESSAGES)  # type: ignore[arg-type]
        waited = time.monotonic() - started
        holder.cancel()
    attempts = server.metric("sluice_requests_refused_total", model="byte-lm", reason="QUEUE_FULL") - refused
    assert attempts == 3  # the first try and the SDK's two retries, each refused by the server
    headers = info.value.response.headers
    assert int(headers["retry-after-ms"]) > 0 and int(headers["retry-after"]) >= 1
    assert waited >= 2 * int(headers["retry-after-ms"]) / 1000 * 0.9  # the SDK waited the server's delay
    assert info.value.code == "queue_full"


def test_leaving_a_stream_of_two_choices_stops_both(server: ServerProcess, shim: ShimProcess) -> None:
    stream = client(shim).chat.completions.create(
        model="byte-lm",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=900,
        n=2,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with stream:
        seen: set[int] = set()
        for chunk in stream:
            seen |= {c.index for c in chunk.choices if c.delta.content}
            if seen == {0, 1}:
                break
    wait_until(
        lambda: server.metric("sluice_sequences_active", model="byte-lm") == 0, what="both sequences gone"
    )
    assert server.metric("sluice_tokens_after_cancel_total") == 0


def test_a_model_without_a_chat_template_gets_the_documented_default(shim: ShimProcess) -> None:
    from server.domain import ChatTurn
    from server.runtimes.base import default_chat_text

    answer = client(shim).chat.completions.create(model="byte-lm", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    rendered = default_chat_text([ChatTurn(m["role"], m["content"]) for m in MESSAGES])
    assert answer.usage is not None and answer.usage.prompt_tokens == len(rendered.encode())


TEXTS = ["A cat sat on the mat.", "Stock markets fell sharply today.", "Kittens like to sleep on rugs."]
#: The README's contract (HTTP API, Embeddings): a text's vector in a batch is this close to its vector alone.
EMBEDDING_ATOL = 1e-5
EMBEDDING_MIN_COSINE = 1 - 1e-6


def test_embeddings_match_the_native_infer_vectors_as_floats_and_base64(
    server: ServerProcess, shim: ShimProcess
) -> None:
    import base64

    import numpy as np

    from clients import SluiceClient
    from shim.openai.response_models import EmbeddingList

    sdk = client(shim)
    floats = sdk.embeddings.create(model="all-minilm-l6-v2", input=TEXTS)  # 3 Infer calls, one bucket
    EmbeddingList.model_validate(floats.model_dump())
    with SluiceClient(server.target) as native:
        alone = [native.infer("all-minilm-l6-v2", {"text": [t]}) for t in TEXTS]
    assert [r.batch_size for r in alone] == [1, 1, 1]
    expected = np.stack([r.outputs["embedding"] for r in alone])
    got = np.array([d.embedding for d in sorted(floats.data, key=lambda d: d.index)], dtype=np.float32)
    # Not bit-equal: batched, a text is padded to the longest and the GEMM shapes change with it (743 of
    # 1,152 floats up to 1.5e-7 apart on one machine, 696 up to 7e-8 on another). Wrong vectors are far out.
    np.testing.assert_allclose(got, expected, rtol=0, atol=EMBEDDING_ATOL)
    assert float(np.einsum("ij,ij->i", got, expected).min()) >= EMBEDDING_MIN_COSINE
    others = [np.abs(got[i] - expected[j]).max() for i in range(3) for j in range(3) if i != j]
    assert min(others) > 1000 * EMBEDDING_ATOL
    assert floats.usage.prompt_tokens > len(TEXTS) * 3  # the encoder's own token counts
    # On this otherwise idle server one text per request is a batch of one, as each native call was: the same
    # batch, so the same bits, which both encodings carry unchanged.
    one = sdk.embeddings.create(model="all-minilm-l6-v2", input=TEXTS[0]).data[0].embedding
    np.testing.assert_array_equal(np.array(one, dtype=np.float32), expected[0])
    raw = sdk.embeddings.with_raw_response.create(
        model="all-minilm-l6-v2", input=TEXTS[0], encoding_format="base64"
    )
    encoded = raw.http_response.json()["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(encoded), "<f4"), expected[0])
    with pytest.raises(openai.BadRequestError) as info:
        sdk.embeddings.create(model="all-minilm-l6-v2", input="x", dimensions=64)
    assert info.value.param == "dimensions"


def test_a_request_of_2048_texts_gets_its_own_error_not_a_cancelled_stream(shim: ShimProcess) -> None:
    """OpenAI's most inputs a request may hold, each its own Infer call: the shim keeps a bounded number in
    flight, so no call is reset past the connection's stream limit and the caller sees the model's error
    (found by schemathesis: 14 of 2,000 calls opened at once came back CANCELLED, answered as 499)."""
    from concurrent.futures import ThreadPoolExecutor

    sdk = client(shim, max_retries=0)

    def refused(_: int) -> openai.APIStatusError:
        with pytest.raises(openai.APIStatusError) as info:
            sdk.embeddings.create(model="mlp", input=[""] * 2048)  # mlp takes no text: every call refused
        return info.value

    with ThreadPoolExecutor(4) as pool:  # 4 x 2,048 calls at once would be 8 times a connection's streams
        errors = list(pool.map(refused, range(8)))
    assert [e.status_code for e in errors] == [400] * 8, [e.message for e in errors]
    assert all("unknown input 'text'" in e.message for e in errors)


def test_a_resent_conversation_reports_its_cached_prompt_tokens(shim: ShimProcess) -> None:
    """Issue 19: the second turn resends the first; the prefix cache held it (usage.prompt_tokens_details)."""
    sdk = client(shim)
    system = {"role": "system", "content": "You answer in one short line. " * 4}
    turn = [system, {"role": "user", "content": "What is a sluice?"}]
    first = sdk.chat.completions.create(model="byte-lm", messages=turn, max_tokens=8, seed=1)  # type: ignore[arg-type]
    answer = first.choices[0].message.content or ""
    again = [*turn, {"role": "assistant", "content": answer}, {"role": "user", "content": "And a weir?"}]
    second = sdk.chat.completions.create(model="byte-lm", messages=again, max_tokens=8, seed=1)  # type: ignore[arg-type]
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= first.usage.prompt_tokens - 16, (cached, first.usage)
