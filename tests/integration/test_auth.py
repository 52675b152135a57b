"""Issue 11, acceptance 2 and 3 (the gRPC side): tokens from a keys file, checked on the metadata before the
body is read; tenants capped to their models, share and rate. Health and reflection stay open."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sluice.inference.v1 import inference_pb2 as pb

from clients import (
    PermissionDeniedError,
    ResourceExhaustedError,
    SluiceClient,
    UnauthenticatedError,
)
from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
ALPHA, BETA = "alpha-secret-token", "beta-secret-token"
X = {"x": np.ones(512, np.float32)}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        f"""
[[tenant]]
name = "alpha"
token_sha256 = "{digest(ALPHA)}"
priority_ceiling = "normal"
share = 0.5

[[tenant]]
name = "beta"
token_sha256 = "{digest(BETA)}"
rate_per_s = 3
models = ["mlp"]
"""
    )
    return keys


@pytest.fixture(scope="module")
def server(keys: Path) -> Iterator[ServerProcess]:
    process = start_server("--models", "mlp,byte-lm", "--auth-keys", str(keys), "--max-sequences", "4")
    yield process
    assert process.terminate() == 0


def test_a_call_without_a_valid_token_is_refused_before_its_body_is_read(server: ServerProcess) -> None:
    for token in (None, "wrong-token"):
        with SluiceClient(server.target, token=token) as client:
            with pytest.raises(UnauthenticatedError):
                client.list_models()
            with pytest.raises(UnauthenticatedError):
                list(client.generate("byte-lm", "hi", max_tokens=2))
    # Bytes that do not parse: refused for the token, not for the body (which nobody read).
    with grpc.insecure_channel(server.target) as channel:
        raw = channel.unary_unary("/sluice.inference.v1.InferenceService/Infer")
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\xff" * 4096, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.metric("sluice_requests_refused_total", method="Infer", reason="UNAUTHENTICATED") >= 1
    assert server.metric("sluice_requests_admitted_total", model="mlp", method="Infer") == 0


def test_health_and_reflection_stay_open(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    listed = subprocess.run(
        [GRPCURL, "-plaintext", server.target, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0 and "sluice.inference.v1.InferenceService" in listed.stdout, listed.stderr


def test_a_valid_token_is_served_and_a_tenant_keeps_to_its_models(server: ServerProcess) -> None:
    with SluiceClient(server.target, token=ALPHA) as client:
        assert client.infer("mlp", X).outputs["y"].shape == (512,)
        assert sum(len(c.token_ids) for c in client.generate("byte-lm", "hi", max_tokens=3)) == 3
    with SluiceClient(server.target, token=BETA) as client:
        with pytest.raises(PermissionDeniedError) as denied:
            list(client.generate("byte-lm", "hi", max_tokens=2))
        assert denied.value.reason == "MODEL_NOT_ALLOWED"


def test_a_tenant_over_its_rate_or_its_share_gets_tenant_quota(server: ServerProcess) -> None:
    with SluiceClient(server.target, token=BETA) as client:
        outcomes: list[str | None] = []
        waits: list[float | None] = []
        for _ in range(6):  # a burst: the bucket holds 3
            try:
                client.infer("mlp", X)
                outcomes.append("ok")
            except ResourceExhaustedError as exc:
                outcomes.append(exc.reason)
                waits.append(exc.retry_after)
    assert outcomes.count("ok") >= 3 and "TENANT_QUOTA" in outcomes
    assert all(wait is not None and wait > 0 for wait in waits)
    # alpha's share is half of byte-lm's 4 slots: a third stream at once is refused, not queued.
    with SluiceClient(server.target, token=ALPHA) as client:
        streams = [client.generate("byte-lm", "long", max_tokens=400, ignore_eos=True) for _ in range(2)]
        firsts = [next(iter(s)) for s in streams]  # both hold a slot now
        assert all(f.token_ids for f in firsts)
        with pytest.raises(ResourceExhaustedError) as over:
            list(client.generate("byte-lm", "third", max_tokens=2))
        assert over.value.reason == "TENANT_QUOTA"
        for stream in streams:
            stream.cancel()
    assert server.metric("sluice_tenant_requests_total", tenant="alpha", outcome="TENANT_QUOTA") >= 1


def test_the_log_never_holds_a_token(server: ServerProcess) -> None:
    assert server.stderr_path is not None
    text = server.stderr_path.read_text()
    assert ALPHA not in text and BETA not in text and "wrong-token" not in text


@pytest.fixture(scope="module")
def shim(server: ServerProcess, keys: Path) -> Iterator[ShimProcess]:
    process = start_shim(server.target, "--auth-keys", str(keys))
    yield process
    process.terminate()


BODY = {"model": "mlp", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}]}


def test_the_shim_refuses_a_request_without_a_token_before_reading_its_body(shim: ShimProcess) -> None:
    native = httpx.post(
        f"{shim.url}/v1/infer", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert native.status_code == 401 and native.json()["error"]["reason"] == "UNAUTHENTICATED"
    chat = httpx.post(
        f"{shim.url}/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}
    )
    assert chat.status_code == 401 and chat.json()["error"]["type"]  # OpenAI's shape
    wrong = httpx.post(f"{shim.url}/v1/infer", json=BODY, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(f"{shim.url}/readyz").status_code == 200  # probes stay open


def test_the_shim_forwards_the_token_and_the_servers_verdicts(
    shim: ShimProcess, server: ServerProcess
) -> None:
    before = server.metric("sluice_tenant_requests_total", tenant="alpha", outcome="admitted")
    ok = httpx.post(f"{shim.url}/v1/infer", json=BODY, headers={"authorization": f"Bearer {ALPHA}"})
    assert ok.status_code == 200, ok.text
    assert httpx.post(f"{shim.url}/v1/infer", json=BODY, headers={"api-key": ALPHA}).status_code == 200
    assert server.metric("sluice_tenant_requests_total", tenant="alpha", outcome="admitted") == before + 2
    body = {"model": "byte-lm", "prompt": "hi", "max_tokens": 2}
    denied = httpx.post(f"{shim.url}/v1/generate", json=body, headers={"authorization": f"Bearer {BETA}"})
    assert denied.status_code == 403 and denied.json()["error"]["reason"] == "MODEL_NOT_ALLOWED"


def test_the_openai_sdk_with_an_api_key(shim: ShimProcess) -> None:
    with openai.OpenAI(base_url=f"{shim.url}/v1", api_key=ALPHA, max_retries=0) as sdk:
        answer = sdk.completions.create(model="byte-lm", prompt="hello", max_tokens=4, seed=1)
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert answer.choices[0].text == byte_lm_reference.text(byte_lm_reference.generate("hello", 4, seed=1))
    with (
        openai.OpenAI(base_url=f"{shim.url}/v1", api_key="wrong", max_retries=0) as wrong,
        pytest.raises(openai.AuthenticationError),
    ):
        wrong.models.list()


def test_metrics_can_be_put_behind_their_own_token() -> None:
    server = start_server("--models", "mlp", "--metrics-token-sha256", digest("scraper"))
    try:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"authorization": "Bearer wrong"}).status_code == 401
        scraped = httpx.get(url, headers={"authorization": "Bearer scraper"})
        assert scraped.status_code == 200 and "sluice_requests_admitted_total" in scraped.text
    finally:
        assert server.terminate() == 0


def test_a_tenants_priority_is_capped_at_its_ceiling(tmp_path: Path) -> None:
    from concurrent.futures import Future

    from tests.integration.test_admission import request, slow
    from tests.support.processes import wait_until

    keys = tmp_path / "keys.toml"
    keys.write_text(
        f'[[tenant]]\nname = "capped"\ntoken_sha256 = "{digest("capped")}"\npriority_ceiling = "low"\n'
        f'[[tenant]]\nname = "plain"\ntoken_sha256 = "{digest("plain")}"\n'
        f'[[tenant]]\nname = "holder"\ntoken_sha256 = "{digest("holder")}"\n'
    )  # a tenant's share counts what it waits for too: the slot is held by a third one
    server = start_server(
        "--plugins", "tests.support.faulty_models", "--models", "faulty", "--max-concurrency", "1",
        "--auth-keys", str(keys),
    )  # fmt: skip
    order: list[str] = []
    try:
        with grpc.insecure_channel(server.target) as channel:
            infer = channel.unary_unary(
                "/sluice.inference.v1.InferenceService/Infer",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=lambda b: b,
            )

            def send(name: str, token: str, seconds: float, priority: int) -> Future[bytes]:
                metadata = (("authorization", f"Bearer {token}"),)
                future: Future[bytes] = infer.future(
                    request("faulty", slow(seconds), priority), metadata=metadata, timeout=60
                )
                future.add_done_callback(lambda _f: order.append(name))
                return future

            def waiting() -> float:
                return server.metric("sluice_requests_waiting", model="faulty")

            calls = [send("blocker", "holder", 1.0, pb.PRIORITY_NORMAL)]
            wait_until(lambda: server.metric("sluice_requests_in_flight", model="faulty") == 1, what="held")
            calls.append(send("capped-high", "capped", 0.01, pb.PRIORITY_HIGH))  # asks HIGH, served as LOW
            wait_until(lambda: waiting() == 1, what="capped waiting")
            calls.append(send("plain-normal", "plain", 0.01, pb.PRIORITY_NORMAL))
            wait_until(lambda: waiting() == 2, what="both waiting")
            for call in calls:
                call.result()
        wait_until(lambda: len(order) == 3, what="every completion recorded")
    finally:
        assert server.terminate() == 0
    assert order == ["blocker", "plain-normal", "capped-high"], order
