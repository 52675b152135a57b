"""Issue 21, acceptance 4 and "errors and admission keep their meaning": v2 calls (the generated
`inference` stubs) meet the same admission as Sluice's own API: tokens and tenants' models, QUEUE_FULL
with RetryInfo, deadlines, Triton's parameters.priority, cancellation; hostile input gets a clear status."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from sluice.kserve.v2 import grpc_service_pb2 as v2
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc

from tests.integration.test_admission import rich, slow, vector
from tests.support.processes import ServerProcess, start_server, wait_until

ALPHA, BETA = "alpha-v2-token", "beta-v2-token"
SERVICE = "/inference.GRPCInferenceService"


def token(value: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {value}"),)


def infer_request(model: str, x: np.ndarray, priority: int | None = None) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, x.size])
    request.raw_input_contents.append(x.tobytes())
    if priority is not None:
        request.parameters["priority"].uint64_param = priority
    return request


def stream_request(model: str, prompt: str, max_tokens: int) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name=model)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(len(prompt.encode()).to_bytes(4, "little") + prompt.encode())
    request.parameters["max_tokens"].int64_param = max_tokens
    return request


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    keys: Path = tmp_path_factory.mktemp("keys") / "keys.toml"
    digest = {name: hashlib.sha256(value.encode()).hexdigest() for name, value in (("a", ALPHA), ("b", BETA))}
    keys.write_text(
        f'[[tenant]]\nname = "alpha"\ntoken_sha256 = "{digest["a"]}"\n\n'
        f'[[tenant]]\nname = "beta"\ntoken_sha256 = "{digest["b"]}"\nmodels = ["faulty"]\n'
    )
    process = start_server(
        "--plugins", "tests.support.faulty_models", "--models", "faulty,byte-lm", "--auth-keys", str(keys),
        "--max-concurrency", "1", "--model-options", "mlp.width=64",
    )  # fmt: skip
    yield process
    assert process.terminate() == 0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One slot and a queue of three (a tenant's share would cap its own queue: this one checks no tokens)."""
    process = start_server(
        "--plugins", "tests.support.faulty_models", "--models", "faulty",
        "--max-concurrency", "1", "--max-queue", "3", "--max-batch-size", "1",
        "--model-options", "mlp.width=64", "--access-log", "1",
    )  # fmt: skip
    yield process
    assert process.terminate() == 0


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[v2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield v2_grpc.GRPCInferenceServiceStub(channel)


def settled(server: ServerProcess) -> None:
    wait_until(lambda: server.metric("sluice_requests_in_flight") == 0, what="nothing in flight")
    wait_until(lambda: server.metric("sluice_requests_waiting") == 0, what="nothing waiting")


def waiting(server: ServerProcess) -> float:
    return server.metric("sluice_requests_waiting", model="faulty", method="ModelInfer")


def test_tokens_tenants_and_their_share(auth_server: ServerProcess) -> None:
    alpha, beta = token(ALPHA), token(BETA)
    with grpc.insecure_channel(auth_server.target) as channel:
        stub: Any = v2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(v2.ServerLiveRequest(), timeout=10).live  # probes stay open
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(infer_request("faulty", vector(1)), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = stub.ModelInfer(infer_request("faulty", vector(1)), metadata=beta, timeout=10)
        assert answer.outputs[0].shape == [1, 512]
        refused = list(stub.ModelStreamInfer(iter([stream_request("byte-lm", "hi", 3)]), metadata=beta))
        assert len(refused) == 1 and refused[0].error_message.startswith(
            "PERMISSION_DENIED MODEL_NOT_ALLOWED"
        )
        served = list(stub.ModelStreamInfer(iter([stream_request("byte-lm", "hi", 3)]), metadata=alpha))
        assert served and not any(r.error_message for r in served)
        blocker = stub.ModelInfer.future(infer_request("faulty", slow(0.8)), metadata=alpha, timeout=30)
        wait_until(lambda: auth_server.metric("sluice_requests_in_flight", model="faulty") == 1, what="in")
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(infer_request("faulty", vector(2)), metadata=alpha, timeout=10)
        error = rich(info.value)
        assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TENANT_QUOTA"), error
        assert error.retry_s is not None
        blocker.result()


def test_queue_full_carries_retry_info_and_a_deadline_is_kept(server: ServerProcess, stub: Any) -> None:
    blocker = stub.ModelInfer.future(infer_request("faulty", slow(1.0)), timeout=30)
    wait_until(lambda: server.metric("sluice_requests_in_flight", model="faulty") == 1, what="blocker in")
    queued = [stub.ModelInfer.future(infer_request("faulty", vector(i)), timeout=30) for i in range(3)]
    wait_until(lambda: waiting(server) == 3, what="a full queue")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(infer_request("faulty", vector(9)), timeout=10)
    error = rich(info.value)
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"), error
    assert error.retry_s is not None and error.retry_s > 0
    for call in (blocker, *queued):
        call.result()
    blocker = stub.ModelInfer.future(infer_request("faulty", slow(0.8)), timeout=30)
    wait_until(lambda: server.metric("sluice_requests_in_flight", model="faulty") == 1, what="blocker in")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(infer_request("faulty", vector(7)), timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    blocker.result()
    settled(server)


def test_triton_priority_one_overtakes_priority_three(server: ServerProcess, stub: Any) -> None:
    order: list[str] = []

    def send(name: str, x: np.ndarray, priority: int | None) -> Future[Any]:
        call: Future[Any] = stub.ModelInfer.future(infer_request("faulty", x, priority), timeout=60)
        call.add_done_callback(lambda _c: order.append(name))
        return call

    calls = [send("blocker", slow(0.8), None)]
    wait_until(lambda: server.metric("sluice_requests_in_flight", model="faulty") == 1, what="blocker in")
    for i, (name, priority) in enumerate((("low0", 3), ("low1", 3), ("high", 1))):
        calls.append(send(name, slow(0.05, i), priority))
        wait_until(lambda n=i + 1: waiting(server) == n, what=f"{i + 1} waiting")
    for call in calls:
        call.result()
    wait_until(lambda: len(order) == 4, what="every answer")
    assert order[:2] == ["blocker", "high"], order
    settled(server)


def test_a_cancelled_call_gives_its_place_back(server: ServerProcess, stub: Any) -> None:
    blocker = stub.ModelInfer.future(infer_request("faulty", slow(0.8)), timeout=30)
    wait_until(lambda: server.metric("sluice_requests_in_flight", model="faulty") == 1, what="blocker in")
    queued = stub.ModelInfer.future(infer_request("faulty", vector(3)), timeout=30)
    wait_until(lambda: waiting(server) == 1, what="one waiting")
    queued.cancel()
    wait_until(lambda: waiting(server) == 0, what="the cancelled call out of the queue")
    blocker.result()
    settled(server)


@pytest.mark.parametrize("raw", [b"\x0a", b"\x0a\x06faulty\x2a", b"\x0a\x06faulty\x12\xff", b"\xff\xff\xff"])
@pytest.mark.parametrize("method", ["ModelInfer", "ModelStreamInfer", "ModelMetadata", "ModelConfig"])
def test_malformed_messages_are_invalid_argument(server: ServerProcess, method: str, raw: bytes) -> None:
    with grpc.insecure_channel(server.target) as channel:
        code = grpc.StatusCode.OK
        try:
            if method == "ModelStreamInfer":
                answers = list(channel.stream_stream(f"{SERVICE}/{method}")(iter([raw])))
                assert len(answers) == 1
                message = v2.ModelStreamInferResponse.FromString(answers[0]).error_message
                assert message.startswith("INVALID_ARGUMENT"), message
                return
            channel.unary_unary(f"{SERVICE}/{method}")(raw, timeout=10)
        except grpc.RpcError as error:
            code = error.code()
    assert code == grpc.StatusCode.INVALID_ARGUMENT, code


def test_a_huge_model_name_and_input_name_are_clipped(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(infer_request("m" * 8000, vector(1)), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert sum(len(v) for _k, v in info.value.trailing_metadata()) < 4000
    request = infer_request("faulty", vector(1))
    request.inputs[0].name = "n" * 100_000
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and len(info.value.details()) < 1000


def test_v2_calls_write_their_access_log_lines(server: ServerProcess, stub: Any) -> None:
    request = infer_request("faulty", vector(5))
    request.id = "logged-v2"
    stub.ModelInfer(request, timeout=10)
    assert server.stderr_path is not None
    path = server.stderr_path

    def logged() -> list[dict[str, Any]]:
        found = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        return [line for line in found if line.get("request_id") == "logged-v2"]

    wait_until(lambda: len(logged()) == 1, what="the v2 call's access-log line")
    (line,) = logged()
    assert (line["method"], line["model"], line["status"]) == ("ModelInfer", "faulty", "OK")
