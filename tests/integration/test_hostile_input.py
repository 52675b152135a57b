"""Hostile gRPC input against real servers (issue 7): huge stop lists (item 1), unbounded echoes (7),
truncated protobuf (8), one model's load against another's (9), made-up names as metric labels (10)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support import byte_lm_reference
from tests.support.faulty_models import SLOW
from tests.support.processes import ServerProcess, start_server, wait_until

PLUGIN = ("--plugins", "tests.support.faulty_models")


def infer_request(model: str, x: np.ndarray) -> pb.InferRequest:
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[x.size], raw_contents=x.tobytes())
    return pb.InferRequest(model=model, inputs=[tensor])


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


def violations(error: grpc.RpcError) -> list[str]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return [v.field for v in bad.field_violations]
    return []


def with_stops(stops: list[str]) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        model="byte-lm", text="Once", sampling=pb.SamplingParams(max_tokens=64, stop=stops, seed=1)
    )


# -- item 1: stop sequences ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stops", "field"),
    [
        ([f"s{i}" for i in range(5)], "sampling.stop"),
        ([f"s{i}" for i in range(400_000)], "sampling.stop"),
        (["ok", "x" * 129], "sampling.stop[1]"),
    ],
    ids=["five", "four-hundred-thousand", "too-long"],
)
def test_oversize_stop_lists_are_refused_naming_the_field(
    stub: pb_grpc.InferenceServiceStub, stops: list[str], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(with_stops(stops), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(info.value).reason == "LIMIT_EXCEEDED"
    assert violations(info.value) == [field]


@pytest.mark.serial  # compares health checks' latency against quiet ones: run alone
def test_huge_stop_lists_cost_the_event_loop_nothing_noticeable(server: ServerProcess) -> None:
    """Eight callers keep sending 400,000-stop requests; health checks answer as fast as usual meanwhile."""
    huge = with_stops([f"stop-{i}" for i in range(400_000)])
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        stub = pb_grpc.InferenceServiceStub(channel)

        def check_s() -> float:
            started = time.perf_counter()
            health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            return time.perf_counter() - started

        quiet = sorted(check_s() for _ in range(20))[10]
        stop_at = time.monotonic() + 3.0

        def attack() -> int:
            sent = 0
            while time.monotonic() < stop_at:
                with pytest.raises(grpc.RpcError):
                    list(stub.Generate(huge, timeout=30))
                sent += 1
            return sent

        with ThreadPoolExecutor(8) as pool:
            attackers = [pool.submit(attack) for _ in range(8)]
            loaded = []
            while time.monotonic() < stop_at:
                loaded.append(check_s())
            sent = sum(a.result() for a in attackers)
        # A valid stop still works after all that: one the seeded stream reaches (its reference's text).
        unstopped = byte_lm_reference.text(byte_lm_reference.generate("Once", 64, seed=1))
        stop = unstopped[8:11]
        assert stop.isprintable() and "\ufffd" not in stop, unstopped
        replies = list(stub.Generate(with_stops([stop]), timeout=30))
    assert sent >= 8
    assert sorted(loaded)[len(loaded) // 2] < max(10 * quiet, 0.05), (quiet, sorted(loaded))
    assert replies[-1].finish_reason == pb.FINISH_REASON_STOP
    assert "".join(r.text for r in replies) == unstopped[: unstopped.index(stop)]


# -- item 7: echoes are clipped ------------------------------------------------------------------------


def test_an_8000_character_model_name_gets_not_found_with_small_trailers(
    stub: pb_grpc.InferenceServiceStub,
) -> None:
    name = "m" * 8000
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(infer_request(name, np.ones(512, np.float32)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    trailers = sum(len(k) + len(v) for k, v in info.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert trailers < 2048, trailers
    assert "(8000 chars)" in (info.value.details() or "")
    assert error_info(info.value).metadata["model"].endswith("(8000 chars)")


def test_an_input_name_of_100_kb_is_clipped_in_the_error(stub: pb_grpc.InferenceServiceStub) -> None:
    tensor = pb.Tensor(name="n" * 100_000, dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=b"\0" * 2048)
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(pb.InferRequest(model="mlp", inputs=[tensor]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(info.value.details() or "") < 1100


# -- item 8: truncated and malformed protobuf -------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"\x0a", b"\x0a\x05mlp", b"\x0a\x03mlp\x12\xff", b"\xff\xff\xff", b"\x0b"])
@pytest.mark.parametrize("method", ["Infer", "Generate"])
def test_malformed_messages_are_invalid_argument(channel: grpc.Channel, method: str, raw: bytes) -> None:
    path = f"/sluice.inference.v1.InferenceService/{method}"

    def call() -> object:
        if method == "Infer":
            return channel.unary_unary(path)(raw, timeout=30)
        return list(channel.unary_stream(path)(raw, timeout=30))

    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert error_info(info.value).reason == "INVALID_ARGUMENT"


# -- items 9 and 10: a gate per model; labels only for served models ---------------------------------------


@pytest.fixture(scope="module")
def capacity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    memory = Path(tmp_path_factory.mktemp("capacity")) / "fraction"
    memory.write_text("0.1")
    server = start_server(
        *PLUGIN,
        "--models", "mlp,wide,faulty",
        "--mlp-width", "256",
        "--memory-probe", f"fake:{memory}",
        "--memory-budget-mb", "8",
    )  # fmt: skip
    yield server
    assert server.terminate() == 0, server.diagnostics()


@pytest.mark.one_frontend  # the engine's capacity plan, read from its metrics
def test_each_tensor_model_gets_the_capacity_measured_for_it(capacity_server: ServerProcess) -> None:
    def slots(model: str) -> float:
        return capacity_server.metric("sluice_admission_slots", model=model, method="Infer")

    # mlp and faulty are the same network; wide needs about twice the memory per request.
    assert slots("mlp") == slots("faulty") > 1.5 * slots("wide") > 0, (slots("mlp"), slots("wide"))


@pytest.fixture(scope="module")
def small_server() -> Iterator[ServerProcess]:
    server = start_server(
        *PLUGIN,
        "--models", "mlp,faulty",
        "--mlp-width", "256",
        "--max-concurrency", "2",
        "--max-queue", "2",
    )  # fmt: skip
    yield server
    assert server.terminate() == 0, server.diagnostics()


def test_one_model_full_leaves_the_other_its_slots_and_labels_stay_bounded(
    small_server: ServerProcess,
) -> None:
    server = small_server
    x = np.random.default_rng(0).standard_normal(512).astype(np.float32)
    slow = x.copy()
    slow[0], slow[1] = SLOW, 5.0
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        held = [stub.Infer.future(infer_request("faulty", slow), timeout=60) for _ in range(4)]
        wait_until(
            lambda: (
                server.metric("sluice_requests_in_flight", model="faulty") == 2
                and server.metric("sluice_requests_waiting", model="faulty") == 2
            ),
            what="faulty's slots held and its queue full",
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(infer_request("faulty", x), timeout=30)
        assert error_info(info.value).reason == "QUEUE_FULL"
        for _ in range(5):  # the other model is not touched by faulty's queue
            assert stub.Infer(infer_request("mlp", x), timeout=30).outputs[0].shape == [512]
        for i in range(50):
            with pytest.raises(grpc.RpcError):
                stub.Infer(infer_request(f"made-up-{i}", x), timeout=30)
        for call in held:
            call.cancel()
    samples = server.metrics()
    labels = {dict(ls).get("model") for _, ls in samples}
    assert not any(str(label).startswith("made-up") for label in labels), sorted(map(str, labels))
    assert server.metric("sluice_requests_refused_total", model="faulty", reason="QUEUE_FULL") >= 1
    assert server.metric("sluice_requests_refused_total", model="", reason="MODEL_NOT_FOUND") >= 50
