"""A deterministic in-process InferenceService for the client tests, served by grpc.aio on port 0.

The server runs on its own event loop in a thread, so that both the blocking and the asyncio client can
call it. Each model name selects one scripted behaviour; `FakeInferenceService` records what arrived.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc import aio
from grpc_status import rpc_status
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients.codec import decode_tensor, encode_tensor

DOMAIN = "sluice.test"


def rich_status(code: grpc.StatusCode, message: str, *details: object) -> grpc.Status:
    """A grpc.Status carrying google.rpc.Status details, built the way servers build it."""
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=packed))


def error_info(reason: str, **metadata: str) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)


async def _abort(context: aio.ServicerContext[object, object], status: grpc.Status) -> None:
    await context.abort(status.code, status.details, status.trailing_metadata)


class FakeInferenceService(pb_grpc.InferenceServiceServicer):
    """Scripted answers keyed by model name; counts attempts so retries are observable."""

    def __init__(self) -> None:
        self.infer_requests: list[pb.InferRequest] = []
        self.generate_requests: list[pb.GenerateRequest] = []
        self.infer_attempts: Counter[str] = Counter()
        self.generate_attempts: Counter[str] = Counter()
        self.stream_started = threading.Event()
        self.stream_cancelled = threading.Event()

    async def Infer(
        self, request: pb.InferRequest, context: aio.ServicerContext[object, object]
    ) -> pb.InferResponse:
        self.infer_requests.append(request)
        self.infer_attempts[request.model] += 1
        if request.model == "flaky" and self.infer_attempts["flaky"] <= 2:
            await _abort(
                context, rich_status(grpc.StatusCode.UNAVAILABLE, "warming up", error_info("WARMING_UP"))
            )
        if request.model == "overloaded":
            retry = error_details_pb2.RetryInfo(
                retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000)
            )
            status = rich_status(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "queue is full",
                error_info("QUEUE_FULL", model="overloaded", queue_depth="64"),
                retry,
            )
            await _abort(context, status)
        if request.model == "strict":
            bad = error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field="inputs[0].shape", description="must be [512]"
                    )
                ]
            )
            status = rich_status(
                grpc.StatusCode.INVALID_ARGUMENT, "bad shape", error_info("SHAPE_MISMATCH", input="x"), bad
            )
            await _abort(context, status)
        if request.model not in ("double", "typed", "flaky"):
            status = rich_status(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.model!r} is not loaded",
                error_info("MODEL_NOT_FOUND", model=request.model),
            )
            await _abort(context, status)
        outputs = [_doubled(tensor, typed=request.model == "typed") for tensor in request.inputs]
        return pb.InferResponse(
            model=request.model,
            model_version="7",
            outputs=outputs,
            timings=pb.Timings(
                queue_wait=duration_pb2.Duration(nanos=250_000_000),
                compute=duration_pb2.Duration(seconds=1, nanos=500_000_000),
                batch_size=3,
            ),
            request_id=request.request_id,
        )

    async def Generate(
        self, request: pb.GenerateRequest, context: aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.generate_requests.append(request)
        self.generate_attempts[request.model] += 1
        if request.model == "echo":
            for response in _echo(request):
                yield response
        elif request.model == "failing":
            yield pb.GenerateResponse(text="Once", token_ids=[1])
            yield pb.GenerateResponse(
                finish_reason=pb.FINISH_REASON_ERROR,
                error=pb.ErrorStatus(code=13, message="decoder failed", reason="DECODE_FAILED"),
                usage=pb.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
            )
        elif request.model == "endless":
            yield pb.GenerateResponse(text="tick", token_ids=[0])
            self.stream_started.set()
            try:
                await asyncio.Event().wait()  # until the client cancels or its deadline passes
            except asyncio.CancelledError:
                self.stream_cancelled.set()
                raise
        elif request.model == "unavailable":
            await _abort(
                context, rich_status(grpc.StatusCode.UNAVAILABLE, "draining", error_info("DRAINING"))
            )
        else:
            await _abort(context, rich_status(grpc.StatusCode.NOT_FOUND, "no such model"))

    async def ListModels(
        self, request: pb.ListModelsRequest, context: aio.ServicerContext[object, object]
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=list(MODELS.values()))

    async def GetModel(
        self, request: pb.GetModelRequest, context: aio.ServicerContext[object, object]
    ) -> pb.GetModelResponse:
        if request.name not in MODELS:
            status = rich_status(
                grpc.StatusCode.NOT_FOUND, "no such model", error_info("MODEL_NOT_FOUND", model=request.name)
            )
            await _abort(context, status)
        return pb.GetModelResponse(model=MODELS[request.name])


MODELS = {
    "double": pb.ModelInfo(
        name="double",
        version="7",
        kind=pb.MODEL_KIND_TENSOR,
        description="doubles its input",
        inputs=[pb.TensorSpec(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[-1, 4])],
        outputs=[pb.TensorSpec(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[-1, 4])],
        limits=pb.ModelLimits(max_batch_size=32),
        device="cpu",
    ),
    "echo": pb.ModelInfo(
        name="echo",
        version="1",
        kind=pb.MODEL_KIND_GENERATIVE,
        limits=pb.ModelLimits(
            max_batch_size=8, context_length=2048, max_tokens=256, max_concurrent_sequences=16
        ),
        device="cuda:0",
    ),
}


def _doubled(tensor: pb.Tensor, *, typed: bool) -> pb.Tensor:
    value = decode_tensor(tensor)
    if isinstance(value, list):
        return encode_tensor(tensor.name, [item.upper() for item in value])
    doubled = np.logical_not(value) if value.dtype == np.bool_ else value * 2
    if not typed:
        return encode_tensor(tensor.name, doubled)
    out = pb.Tensor(name=tensor.name, dtype=tensor.dtype, shape=tensor.shape)
    field = {
        pb.DATA_TYPE_FLOAT32: "fp32_contents",
        pb.DATA_TYPE_FLOAT16: "fp32_contents",
        pb.DATA_TYPE_FLOAT64: "fp64_contents",
        pb.DATA_TYPE_INT32: "int32_contents",
        pb.DATA_TYPE_INT64: "int64_contents",
        pb.DATA_TYPE_BOOL: "bool_contents",
    }[tensor.dtype]
    getattr(out.contents, field).extend(doubled.ravel().tolist())
    return out


def _echo(request: pb.GenerateRequest) -> Iterator[pb.GenerateResponse]:
    """One message per word of the prompt (or per token id), stopping at max_tokens when it is set."""
    words = request.text.split() if request.HasField("text") else [f"<{i}>" for i in request.token_ids.ids]
    limit = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else len(words)
    emitted = words[:limit]
    for index, word in enumerate(emitted):
        yield pb.GenerateResponse(text=word + " ", token_ids=[index])
    prompt_tokens = len(words)
    yield pb.GenerateResponse(
        finish_reason=pb.FINISH_REASON_LENGTH if limit < len(words) else pb.FINISH_REASON_STOP,
        usage=pb.Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(emitted),
            total_tokens=prompt_tokens + len(emitted),
        ),
    )


@dataclass
class FakeServer:
    target: str
    service: FakeInferenceService


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    service = FakeInferenceService()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-sluice-server", daemon=True)
    thread.start()

    async def start() -> tuple[aio.Server, int]:
        server = aio.server()
        pb_grpc.add_InferenceServiceServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield FakeServer(target=f"127.0.0.1:{port}", service=service)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
