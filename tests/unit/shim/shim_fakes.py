"""A deterministic in-process InferenceService for the shim's tests, and rich-status builders that
produce google.rpc details exactly as the real server does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc


def rich_status(
    code: int,
    message: str,
    *,
    reason: str,
    retry_after_s: float | None = None,
    violations: tuple[tuple[str, str], ...] = (),
    metadata: dict[str, str] | None = None,
) -> grpc.Status:
    """A grpc.Status carrying google.rpc details exactly as the real server builds them."""
    details = []
    info = error_details_pb2.ErrorInfo(reason=reason, domain="sluice.inference.v1", metadata=metadata or {})
    details.append(info)
    if retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_after_s * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    if violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in violations
            ]
        )
        details.append(bad)
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=packed))


@dataclass
class FakeInference(inference_pb2_grpc.InferenceServiceServicer):
    """Behaviour chosen by model name; records what it received so tests can check the translation."""

    infer_requests: list[pb.InferRequest] = field(default_factory=list)
    generate_requests: list[pb.GenerateRequest] = field(default_factory=list)
    invocation_metadata: list[dict[str, Any]] = field(default_factory=list)
    infer_attempts: int = 0
    generate_attempts: int = 0
    generation_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    generation_started: asyncio.Event = field(default_factory=asyncio.Event)
    release_slow: asyncio.Event = field(default_factory=asyncio.Event)
    endless_sent: int = 0

    async def Infer(self, request: pb.InferRequest, context: Any) -> pb.InferResponse:
        self.infer_attempts += 1
        self.infer_requests.append(request)
        self.invocation_metadata.append({"time_remaining": context.time_remaining()})
        if request.model == "missing":
            await context.abort_with_status(
                rich_status(code_pb2.NOT_FOUND, "model 'missing' is not loaded", reason="MODEL_NOT_FOUND")
            )
        if request.model == "busy":
            await context.abort_with_status(
                rich_status(code_pb2.RESOURCE_EXHAUSTED, "queue full", reason="QUEUE_FULL", retry_after_s=2.5)
            )
        if request.model == "huge":
            await context.abort_with_status(
                rich_status(code_pb2.RESOURCE_EXHAUSTED, "too large", reason="REQUEST_TOO_LARGE")
            )
        if request.model == "bad-shape":
            await context.abort_with_status(
                rich_status(
                    code_pb2.INVALID_ARGUMENT,
                    "bad shape",
                    reason="INVALID_ARGUMENT",
                    violations=(("inputs[0].shape", "expected [4]"),),
                )
            )
        if request.model == "flaky" and self.infer_attempts == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        # "echo": outputs are the inputs doubled, as raw little-endian float32.
        outputs = []
        for tensor in request.inputs:
            values = np.asarray(tensor.contents.fp32_contents, dtype="<f4")
            if tensor.raw_contents:
                values = np.frombuffer(tensor.raw_contents, dtype="<f4")
            outputs.append(
                pb.Tensor(
                    name=f"{tensor.name}_x2",
                    dtype=pb.DATA_TYPE_FLOAT32,
                    shape=tensor.shape,
                    raw_contents=(values * 2).astype("<f4").tobytes(),
                )
            )
        return pb.InferResponse(
            model=request.model,
            model_version="7",
            outputs=outputs,
            request_id=request.request_id,
            timings=pb.Timings(
                queue_wait=duration_pb2.Duration(nanos=1_500_000),
                compute=duration_pb2.Duration(seconds=1, nanos=250_000_000),
                batch_size=3,
            ),
        )

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        self.generate_attempts += 1
        self.generate_requests.append(request)
        model = request.model
        if model == "gen-busy":
            await context.abort_with_status(
                rich_status(code_pb2.RESOURCE_EXHAUSTED, "queue full", reason="QUEUE_FULL", retry_after_s=0.2)
            )
        if model == "gen-unavailable":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        if model == "gen-bad-temperature":
            await context.abort_with_status(
                rich_status(
                    code_pb2.INVALID_ARGUMENT,
                    "temperature must be >= 0",
                    reason="INVALID_ARGUMENT",
                    violations=(("sampling.temperature", "must be >= 0"),),
                )
            )
        if model == "gen-midfail":
            yield pb.GenerateResponse(text="a", token_ids=[1])
            await context.abort_with_status(
                rich_status(code_pb2.INTERNAL, "model crashed", reason="MODEL_ERROR")
            )
        if model == "gen-error-final":
            yield pb.GenerateResponse(text="a", token_ids=[1])
            yield pb.GenerateResponse(
                finish_reason=pb.FINISH_REASON_ERROR,
                usage=pb.Usage(prompt_tokens=2, completion_tokens=1, total_tokens=3),
                error=pb.ErrorStatus(code=13, message="model crashed", reason="MODEL_ERROR"),
            )
            return
        if model == "gen-slow":
            yield pb.GenerateResponse(text="a", token_ids=[1])
            await self.release_slow.wait()
            yield pb.GenerateResponse(
                text="b",
                token_ids=[2],
                finish_reason=pb.FINISH_REASON_STOP,
                usage=pb.Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
            )
            return
        if model == "gen-endless":
            self.generation_started.set()
            try:
                while True:
                    self.endless_sent += 1
                    yield pb.GenerateResponse(text="x", token_ids=[self.endless_sent % 100])
            finally:
                self.generation_cancelled.set()
        # "gen": one message per prompt character, up to max_tokens, then a final LENGTH message.
        prompt = request.text or "".join(chr(97 + i % 26) for i in request.token_ids.ids)
        limit = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else len(prompt)
        emitted = prompt[:limit]
        for index, char in enumerate(emitted):
            yield pb.GenerateResponse(text=char, token_ids=[index])
        yield pb.GenerateResponse(
            finish_reason=pb.FINISH_REASON_LENGTH,
            usage=pb.Usage(
                prompt_tokens=len(prompt),
                completion_tokens=len(emitted),
                total_tokens=len(prompt) + len(emitted),
            ),
        )

    async def ListModels(self, request: pb.ListModelsRequest, context: Any) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[MODEL_INFO])

    async def GetModel(self, request: pb.GetModelRequest, context: Any) -> pb.GetModelResponse:
        if request.name != MODEL_INFO.name:
            await context.abort_with_status(
                rich_status(
                    code_pb2.NOT_FOUND,
                    f"model {request.name!r} is not loaded",
                    reason="MODEL_NOT_FOUND",
                    metadata={"model": request.name},
                )
            )
        return pb.GetModelResponse(model=MODEL_INFO)


MODEL_INFO = pb.ModelInfo(
    name="echo",
    version="7",
    kind=pb.MODEL_KIND_TENSOR,
    description="doubles its input",
    inputs=[pb.TensorSpec(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[-1])],
    outputs=[pb.TensorSpec(name="x_x2", dtype=pb.DATA_TYPE_FLOAT32, shape=[-1])],
    limits=pb.ModelLimits(max_batch_size=8),
    device="cpu",
)
