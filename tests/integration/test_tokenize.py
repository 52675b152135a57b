"""Issue 31, item 3: vLLM's /tokenize and /detokenize on the shim and the Tokenize and Detokenize RPCs of
Sluice's own contract, on SmolLM2: the token ids are the ones transformers' own tokenizer gives for the
same text (special tokens as asked) or the same conversation under the model's chat template (with and
without the generation prompt), and detokenize gives its text back; errors in vLLM's shape, refusals from
admission as for any other call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from server.runtimes.smollm2 import smollm2_gguf
from tests.support.packages import require
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

require("transformers", "gguf")

PROMPT = "The capital of France is Paris. Ünïcödé and emoji 🚀 too."
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--models", "byte-lm,smollm2")
    shim = start_shim(server.target)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


@pytest.fixture(scope="module")
def reference() -> Any:
    """transformers' own tokenizer of the GGUF file, as AutoTokenizer loads it."""
    import transformers

    path = smollm2_gguf()
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def post(shim: ShimProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{shim.url}{path}", json=body, timeout=60)


def test_a_prompt_is_the_tokenizers_ids_and_detokenizes_back(
    stack: tuple[ServerProcess, ShimProcess], reference: Any
) -> None:
    server, shim = stack
    answer = post(shim, "/tokenize", {"model": "smollm2", "prompt": PROMPT})
    assert answer.status_code == 200, answer.text
    tokens = answer.json()["tokens"]
    assert tokens == reference(PROMPT)["input_ids"]  # add_special_tokens: true, vLLM's default
    assert answer.json()["count"] == len(tokens)
    with grpc.insecure_channel(server.target) as channel:
        info = pb_grpc.InferenceServiceStub(channel).GetModel(pb.GetModelRequest(name="smollm2"), timeout=30)
    assert answer.json()["max_model_len"] == info.model.limits.context_length
    bare = post(shim, "/tokenize", {"model": "smollm2", "prompt": PROMPT, "add_special_tokens": False})
    assert bare.json()["tokens"] == reference.encode(PROMPT, add_special_tokens=False)
    back = post(shim, "/detokenize", {"model": "smollm2", "tokens": tokens})
    assert back.status_code == 200 and back.json() == {"prompt": reference.decode(tokens)}
    assert back.json()["prompt"] == PROMPT


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_messages_are_the_chat_templates_ids(
    stack: tuple[ServerProcess, ShimProcess], reference: Any, generation_prompt: bool
) -> None:
    _, shim = stack
    body = {"model": "smollm2", "messages": MESSAGES, "add_generation_prompt": generation_prompt}
    answer = post(shim, "/tokenize", body)
    assert answer.status_code == 200, answer.text
    expected = reference.apply_chat_template(MESSAGES, add_generation_prompt=generation_prompt, tokenize=True)
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert answer.json()["tokens"] == expected


def test_a_generate_prompt_counts_what_tokenize_says(stack: tuple[ServerProcess, ShimProcess]) -> None:
    _, shim = stack
    counted = post(shim, "/tokenize", {"model": "smollm2", "messages": MESSAGES}).json()["count"]
    chat = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 1}
    answer = httpx.post(f"{shim.url}/v1/chat/completions", json=chat, timeout=60).json()
    assert answer["usage"]["prompt_tokens"] == counted


def test_the_rpcs_answer_and_are_admitted(stack: tuple[ServerProcess, ShimProcess], reference: Any) -> None:
    server, _ = stack

    def admitted(method: str) -> float:
        return server.metric("sluice_requests_admitted_total", model="smollm2", method=method)

    before = admitted("Tokenize"), admitted("Detokenize")
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        chat = pb.ChatPrompt(
            messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES]
        )
        tokenized = stub.Tokenize(
            pb.TokenizeRequest(model="smollm2", chat=chat, request_id="tok-1"), timeout=30
        )
        assert tokenized.request_id == "tok-1" and tokenized.model == "smollm2"
        expected = reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
        assert list(tokenized.token_ids) == (
            expected if isinstance(expected, list) else expected["input_ids"]
        )
        text = stub.Detokenize(
            pb.DetokenizeRequest(model="smollm2", token_ids=tokenized.token_ids), timeout=30
        )
        assert text.text == reference.decode(list(tokenized.token_ids))
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Tokenize(pb.TokenizeRequest(model="nope", text="hi"), timeout=30)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as outside:
            stub.Detokenize(pb.DetokenizeRequest(model="smollm2", token_ids=[1, 10**9]), timeout=30)
        assert outside.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "token_ids[1]" in str(outside.value.trailing_metadata())
    # Each call through its model's gate: the one tokenize, both detokenizes (the second refused after).
    assert (admitted("Tokenize"), admitted("Detokenize")) == (before[0] + 1, before[1] + 2)
    assert server.metric("sluice_requests_refused_total", method="Tokenize", reason="MODEL_NOT_FOUND") >= 1


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "nope", "prompt": "hi"}, 404, None),
        ("/tokenize", {"model": "smollm2"}, 400, "$"),
        ("/tokenize", {"model": "smollm2", "prompt": "hi", "messages": MESSAGES}, 400, "$"),
        (
            "/tokenize",
            {"model": "smollm2", "prompt": "hi", "return_token_strs": True},
            400,
            "return_token_strs",
        ),
        ("/tokenize", {"model": "smollm2", "messages": [{"role": "robot", "content": "x"}]}, 400, None),
        ("/tokenize", {"model": "smollm2", "prompt": "hi", "surprise": 1}, 400, "surprise"),
        ("/detokenize", {"model": "smollm2", "tokens": [10**9]}, 400, "tokens[0]"),
        ("/detokenize", {"model": "smollm2", "tokens": [-1]}, 400, "tokens[0]"),
        ("/detokenize", {"model": "smollm2", "tokens": "1 2"}, 400, "tokens"),
    ],
)
def test_refusals_are_in_vllms_shape(
    stack: tuple[ServerProcess, ShimProcess], path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    _, shim = stack
    answer = post(shim, path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    if param is not None:
        assert error["param"] == param, error
