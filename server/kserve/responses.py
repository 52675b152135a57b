"""domain -> v2 responses: a batch's results as one ModelInferResponse (raw outputs, as Triton answers
over gRPC), a Generate chunk as one ModelStreamInferResponse, and a model's metadata and ModelConfig."""

from __future__ import annotations

import numpy as np
from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.domain import Array, DType, InferResult, ModelDescriptor, ModelKind, TensorSpec, TokenChunk
from server.kserve.calls import DEFAULT_PRIORITY_LEVEL, PRIORITY_LEVELS
from server.kserve.datatypes import CONFIG_TYPE, TO_V2
from server.kserve.requests import TEXT_INPUT, TEXT_OUTPUT
from server.kserve.tensors import to_raw
from wire.kserve import stream_error_message

PLATFORM = "sluice"
#: Asked for with tritonclient's `enable_empty_final_response`: every response says whether it is the last.
FINAL_FLAG = "triton_final_response"
ENABLE_FINAL = "triton_enable_empty_final_response"


def encode_infer(
    model: str, request_id: str, results: list[InferResult], requested: list[str] | None
) -> v2.ModelInferResponse:
    names = requested if requested is not None else list(results[0].outputs)
    response = v2.ModelInferResponse(model_name=model, model_version=results[0].model_version, id=request_id)
    for name in names:
        # One row (the common call) is sent from its output buffer; more are stacked first.
        rows: Array = (
            results[0].outputs[name][None]
            if len(results) == 1
            else np.stack([r.outputs[name] for r in results])
        )
        datatype, raw = to_raw(rows)
        response.outputs.add(name=name, datatype=datatype, shape=rows.shape)
        response.raw_output_contents.append(raw)
    return response


def encode_chunk(
    model: str, version: str, request_id: str, chunk: TokenChunk, *, flag_final: bool
) -> v2.ModelStreamInferResponse:
    """One streamed response; an error chunk becomes the stream's `error_message`, as Triton reports a
    failed request on a stream that goes on."""
    if chunk.error is not None:
        text = stream_error_message(chunk.error.code, chunk.error.reason, chunk.error.message)
        return v2.ModelStreamInferResponse(error_message=text)
    response = v2.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    datatype, raw = to_raw(np.array([chunk.text], dtype=object))
    response.outputs.add(name=TEXT_OUTPUT, datatype=datatype, shape=[1])
    response.raw_output_contents.append(raw)
    final = chunk.finish_reason is not None
    if final:
        response.parameters["finish_reason"].string_param = chunk.finish_reason.value  # type: ignore[union-attr]
    if flag_final:
        response.parameters[FINAL_FLAG].bool_param = final
    return v2.ModelStreamInferResponse(infer_response=response)


def tensor_specs(descriptor: ModelDescriptor) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """A Generate model's v2 face: a BYTES prompt in, BYTES text out."""
    if descriptor.kind is ModelKind.GENERATIVE:
        return (TensorSpec(TEXT_INPUT, DType.STRING, (1,)),), (TensorSpec(TEXT_OUTPUT, DType.STRING, (1,)),)
    return descriptor.inputs, descriptor.outputs


def encode_metadata(descriptor: ModelDescriptor) -> v2.ModelMetadataResponse:
    """Shapes include the batch dimension (-1) for a batching model, as Triton's metadata does."""
    inputs, outputs = tensor_specs(descriptor)
    batch = (-1,) if descriptor.kind is ModelKind.TENSOR else ()
    Meta = v2.ModelMetadataResponse.TensorMetadata
    return v2.ModelMetadataResponse(
        name=descriptor.name,
        versions=[descriptor.version],
        platform=PLATFORM,
        inputs=[Meta(name=s.name, datatype=TO_V2[s.dtype], shape=(*batch, *s.shape)) for s in inputs],
        outputs=[Meta(name=s.name, datatype=TO_V2[s.dtype], shape=(*batch, *s.shape)) for s in outputs],
    )


def encode_config(descriptor: ModelDescriptor) -> v2.ModelConfig:
    """What Triton's clients read: max_batch_size, dims without the batch dimension, dynamic batching with
    Sluice's priority levels; a Generate model is decoupled (many responses per request) and unbatched."""
    inputs, outputs = tensor_specs(descriptor)
    tensor = descriptor.kind is ModelKind.TENSOR
    config = v2.ModelConfig(
        name=descriptor.name,
        platform=PLATFORM,
        backend=PLATFORM,
        max_batch_size=descriptor.limits.max_batch_size if tensor else 0,
        input=[v2.ModelInput(name=s.name, data_type=CONFIG_TYPE[s.dtype], dims=s.shape) for s in inputs],
        output=[v2.ModelOutput(name=s.name, data_type=CONFIG_TYPE[s.dtype], dims=s.shape) for s in outputs],
        model_transaction_policy=v2.ModelTransactionPolicy(decoupled=not tensor),
    )
    config.dynamic_batching.priority_levels = PRIORITY_LEVELS
    config.dynamic_batching.default_priority_level = DEFAULT_PRIORITY_LEVEL
    config.parameters["device"].string_value = descriptor.device
    return config
