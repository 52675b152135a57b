"""AdmissionInterceptor in a real in-process grpc.aio server with a scripted servicer: a refused call never
reaches the servicer, an admitted one holds its model's slot until it returns (a stream: until its last
message), refusals are labelled only with served models, and unguarded methods parse safely too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from server.admission.gate import AdmissionGate
from server.admission.interceptor import AdmissionInterceptor
from server.admission.reader import GuardedMethod
from server.metrics import Metrics

pytestmark = pytest.mark.anyio
SERVICE = "/sluice.inference.v1.InferenceService"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Servicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, gates: dict[str, AdmissionGate]) -> None:
        self.gates = gates
        self.calls = 0
        self.held_during: list[int] = []
        self.release = asyncio.Event()

    async def Infer(self, request: pb.InferRequest, context: Any) -> pb.InferResponse:
        self.calls += 1
        self.held_during.append(self.gates[request.model].in_use)
        await self.release.wait()
        return pb.InferResponse(model=request.model, request_id=request.request_id)

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        self.calls += 1
        for _ in range(3):
            self.held_during.append(self.gates[request.model].in_use)
            yield pb.GenerateResponse(text="x")

    async def GetModel(self, request: pb.GetModelRequest, context: Any) -> pb.GetModelResponse:
        return pb.GetModelResponse()


class Harness:
    def __init__(self) -> None:
        self.gates = {
            "mlp": AdmissionGate("Infer mlp", slots=1, max_waiting=0),
            "lm": AdmissionGate("Generate lm", slots=2, max_waiting=0),
        }
        self.metrics = Metrics()
        methods = {
            f"{SERVICE}/Infer": GuardedMethod(
                "Infer", pb.InferRequest.DESCRIPTOR, {"mlp": self.gates["mlp"]}, {"lm": "Generate"}
            ),
            f"{SERVICE}/Generate": GuardedMethod(
                "Generate", pb.GenerateRequest.DESCRIPTOR, {"lm": self.gates["lm"]}, {"mlp": "Infer"}
            ),
        }
        self.interceptor = AdmissionInterceptor(
            methods, breaker=None, metrics=self.metrics, max_message_bytes=1 << 20, stall_timeout_s=10
        )
        self.interceptor.ready = True
        self.servicer = Servicer(self.gates)

    async def __aenter__(self) -> Harness:
        self.server = grpc.aio.server(interceptors=[self.interceptor])
        pb_grpc.add_InferenceServiceServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.InferenceServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(None)

    def refused(self, model: str, reason: str) -> float:
        return self.metrics.refused.labels(model, "Infer", reason)._value.get()  # type: ignore[attr-defined]


async def until(predicate: Any) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise TimeoutError


async def test_a_unary_call_holds_its_slot_and_a_full_model_refuses_without_the_servicer() -> None:
    async with Harness() as h:
        first = asyncio.ensure_future(h.stub.Infer(pb.InferRequest(model="mlp"), timeout=10))
        await until(lambda: h.servicer.calls == 1)
        assert h.servicer.held_during == [1]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await h.stub.Infer(pb.InferRequest(model="mlp"), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert h.servicer.calls == 1 and h.refused("mlp", "QUEUE_FULL") == 1
        h.servicer.release.set()
        await first
        assert h.gates["mlp"].in_use == 0


async def test_a_stream_holds_its_slot_until_its_last_message() -> None:
    async with Harness() as h:
        h.servicer.release.set()
        messages = [m async for m in h.stub.Generate(pb.GenerateRequest(model="lm", text="x"), timeout=10)]
        assert len(messages) == 3 and h.servicer.held_during == [1, 1, 1]
        await until(lambda: h.gates["lm"].in_use == 0)


async def test_unknown_and_wrong_rpc_models_never_reach_the_servicer_and_made_up_names_are_no_label() -> None:
    async with Harness() as h:
        for model, code, reason, label in [
            ("made-up", grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", ""),
            ("lm", grpc.StatusCode.FAILED_PRECONDITION, "WRONG_METHOD", "lm"),
            ("", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", ""),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await h.stub.Infer(pb.InferRequest(model=model), timeout=10)
            assert info.value.code() == code
            assert h.refused(label, reason) == 1
        assert h.servicer.calls == 0
        labels = {s.labels.get("model") for m in h.metrics.registry.collect() for s in m.samples}
        assert "made-up" not in labels


async def test_draining_and_warming_up_refuse_with_unavailable() -> None:
    async with Harness() as h:
        h.interceptor.ready = False
        with pytest.raises(grpc.aio.AioRpcError) as warming:
            await h.stub.Infer(pb.InferRequest(model="mlp"), timeout=10)
        h.interceptor.ready, h.interceptor.draining = True, True
        with pytest.raises(grpc.aio.AioRpcError) as draining:
            await h.stub.Infer(pb.InferRequest(model="mlp"), timeout=10)
        assert warming.value.code() == draining.value.code() == grpc.StatusCode.UNAVAILABLE
        assert h.refused("mlp", "NOT_READY") == 1 and h.refused("mlp", "SHUTTING_DOWN") == 1


async def test_an_unguarded_method_answers_unparsable_bytes_with_invalid_argument() -> None:
    async with Harness() as h:
        get_model = h.channel.unary_unary(f"{SERVICE}/GetModel")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await get_model(b"\x0a", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_generated_request_ids_are_16_hex_digits_and_unique() -> None:
    from server.admission.interceptor import RequestIds

    ids = RequestIds()
    drawn = [ids.next() for _ in range(10_000)]
    assert len(set(drawn)) == len(drawn)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in drawn)
