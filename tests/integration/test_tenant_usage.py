"""Usage per tenant (issue 22, item 3): prompt, completion and cached tokens are counted by tenant and model
(labels bounded by the keys file and the served models), a caller that leaves is counted for what was
generated for it, and the shim's access-log line names the tenant, the model and the tokens. Issue 35: the
prefix cache's salt is the tenant's on both APIs (server/submission.py resolves it once for both)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import grpc
import openai
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc
from sluice.kserve.v2 import grpc_service_pb2 as v2
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

ALPHA, BETA = "alpha-usage-token", "beta-usage-token"
COUNTERS = ("sluice_prompt_tokens_total", "sluice_completion_tokens_total")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        "".join(
            f'[[tenant]]\nname = "{name}"\ntoken_sha256 = "{digest(token)}"\n\n'
            for name, token in (("alpha", ALPHA), ("beta", BETA))
        )
    )
    server = start_server("--models", "byte-lm", "--auth-keys", str(keys))
    shim = start_shim(server.target, "--auth-keys", str(keys), "--access-log", "1")
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


def generate(
    stub: pb_grpc.InferenceServiceStub, token: str, max_tokens: int, text: str = "count me"
) -> pb.GenerateResponse:
    request = pb.GenerateRequest(
        model="byte-lm", text=text, sampling=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )
    return list(stub.Generate(request, metadata=(("authorization", f"Bearer {token}"),), timeout=30))[-1]


def test_tokens_in_and_out_are_counted_by_tenant_and_model(stack: tuple[ServerProcess, ShimProcess]) -> None:
    server, shim = stack
    before = {
        (c, t): server.metric(c, tenant=t, model="byte-lm") for c in COUNTERS for t in ("alpha", "beta")
    }
    with openai.OpenAI(base_url=f"{shim.url}/v1", api_key=ALPHA, max_retries=0) as client:
        answers = [
            client.chat.completions.create(
                model="byte-lm",
                messages=[{"role": "user", "content": "bill me " * k}],
                max_tokens=5,
                extra_body={"ignore_eos": True},
            )
            for k in (1, 3)
        ]
    with grpc.insecure_channel(server.target) as channel:
        last = generate(pb_grpc.InferenceServiceStub(channel), BETA, 7)
    alpha_prompt = sum(a.usage.prompt_tokens for a in answers if a.usage)
    assert server.metric("sluice_prompt_tokens_total", tenant="alpha", model="byte-lm") == (
        before["sluice_prompt_tokens_total", "alpha"] + alpha_prompt
    )
    assert server.metric("sluice_completion_tokens_total", tenant="alpha", model="byte-lm") == (
        before["sluice_completion_tokens_total", "alpha"] + 10
    )
    assert server.metric("sluice_prompt_tokens_total", tenant="beta", model="byte-lm") == (
        before["sluice_prompt_tokens_total", "beta"] + last.usage.prompt_tokens
    )
    assert server.metric("sluice_completion_tokens_total", tenant="beta", model="byte-lm") == (
        before["sluice_completion_tokens_total", "beta"] + 7
    )
    assert shim.stderr_path is not None

    def shim_lines() -> list[dict[str, object]]:
        assert shim.stderr_path is not None
        text = shim.stderr_path.read_text().splitlines()
        return [json.loads(line) for line in text if line.startswith("{") and "completion_tokens" in line]

    wait_until(lambda: len(shim_lines()) >= 2, what="two shim access-log lines with tokens")
    logged = shim_lines()[-2:]
    assert [(x["tenant"], x["model"], x["completion_tokens"]) for x in logged] == [
        ("alpha", "byte-lm", 5)
    ] * 2
    assert sorted(int(str(x["prompt_tokens"])) for x in logged) == sorted(
        a.usage.prompt_tokens for a in answers if a.usage
    )


def test_a_caller_that_leaves_is_counted_and_labels_stay_bounded(
    stack: tuple[ServerProcess, ShimProcess],
) -> None:
    server, _ = stack
    before = server.metric("sluice_completion_tokens_total", tenant="beta", model="byte-lm")
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        request = pb.GenerateRequest(
            model="byte-lm", text="leave early", sampling=pb.SamplingParams(max_tokens=400, ignore_eos=True)
        )
        call = stub.Generate(request, metadata=(("authorization", f"Bearer {BETA}"),), timeout=30)
        received = len(next(call).token_ids)
        call.cancel()
        with pytest.raises(grpc.RpcError):  # a made-up token never becomes a label
            generate(stub, "made-up-token", 2)
    wait_until(
        lambda: (
            server.metric("sluice_completion_tokens_total", tenant="beta", model="byte-lm")
            >= before + received
        ),
        what="the cancelled stream's tokens counted",
    )
    tenants = {dict(labels).get("tenant") for (name, labels) in server.metrics() if name in COUNTERS}
    assert tenants == {"alpha", "beta"}


def test_a_prompt_cached_on_one_api_is_a_hit_for_its_tenant_on_the_other_only(
    stack: tuple[ServerProcess, ShimProcess],
) -> None:
    """Alpha's v2 stream leaves the prompt in the prefix cache under alpha's salt: alpha's Generate finds
    it, beta's (another salt) does not."""
    server, _ = stack
    prompt = "A sluice holds back the water and lets it through in measure, one lock at a time. " * 2
    request = v2.ModelInferRequest(model_name="byte-lm")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(len(prompt.encode()).to_bytes(4, "little") + prompt.encode())
    request.parameters["max_tokens"].int64_param = 2
    with grpc.insecure_channel(server.target) as channel:
        alpha = (("authorization", f"Bearer {ALPHA}"),)
        streamed = list(
            v2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]), metadata=alpha)
        )
        assert streamed and not any(r.error_message for r in streamed), streamed
        stub = pb_grpc.InferenceServiceStub(channel)
        other = generate(stub, BETA, 2, prompt)
        same = generate(stub, ALPHA, 2, prompt)
    assert other.usage.cached_tokens == 0
    assert same.usage.cached_tokens >= same.usage.prompt_tokens - 16, same.usage
