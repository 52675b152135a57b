"""Request messages from call arguments, and result dataclasses from response messages.

The one request builder: shared by the sync and asyncio clients, so that both are only thin wrappers
around the stub calls, and by the shim, which builds the same messages from JSON bodies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import duration_pb2
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import (
    InputValue,
    decode_tensor,
    dtype_name,
    encode_parameters,
    encode_priority,
    encode_tensor,
    finish_reason_name,
)
from clients.errors import status_code_from_number
from clients.types import (
    ChatMessage,
    GenerationChunk,
    InferResult,
    ModelInfo,
    ModelKind,
    ParameterScalar,
    PriorityName,
    StreamError,
    TensorSpec,
    TokenLogprob,
    TokenProbability,
    Usage,
)
from wire.constraint import Constraint, Tool, ToolCall, ToolChoice
from wire.sampling import Sampling

__all__ = [
    "build_generate_request",
    "build_infer_request",
    "chunk_from_response",
    "infer_request",
    "model_info_from_proto",
    "result_from_response",
]

_UINT64_MAX = 2**64 - 1
_MODEL_KINDS: dict[pb.ModelKind.ValueType, ModelKind] = {
    pb.MODEL_KIND_TENSOR: "tensor",
    pb.MODEL_KIND_GENERATIVE: "generative",
}


def build_infer_request(
    model: str,
    inputs: Mapping[str, InputValue],
    *,
    priority: PriorityName | None,
    request_id: str | None,
    parameters: Mapping[str, ParameterScalar] | None,
) -> pb.InferRequest:
    """The InferRequest for one item; every input is encoded by the codec."""
    return infer_request(
        model,
        [encode_tensor(name, value) for name, value in inputs.items()],
        priority=priority,
        request_id=request_id,
        parameters=parameters,
    )


def infer_request(
    model: str,
    tensors: Iterable[pb.Tensor],
    *,
    priority: PriorityName | None,
    request_id: str | None,
    parameters: Mapping[str, ParameterScalar] | None,
) -> pb.InferRequest:
    """The InferRequest around already encoded input tensors; outputs are asked for as raw bytes."""
    return pb.InferRequest(
        model=model,
        inputs=tensors,
        parameters=encode_parameters(parameters),
        priority=encode_priority(priority),
        request_id=request_id or "",
        typed_outputs=False,
    )


def build_generate_request(
    model: str,
    prompt: str | Sequence[int] | Sequence[ChatMessage],
    *,
    sampling: Sampling | None = None,
    priority: PriorityName | None = None,
    request_id: str | None = None,
    constraint: Constraint | None = None,
    tools: Sequence[Tool] = (),
    tool_choice: ToolChoice | None = None,
    parallel_tool_calls: bool | None = None,
    **fields: Any,
) -> pb.GenerateRequest:
    """The GenerateRequest. Sampling settings come as a `Sampling` or as its fields by keyword
    (`max_tokens=16`), not both; unset ones stay unset so that the server's defaults apply. `constraint`
    says what the output must be (wire/constraint.py); `tools` and `tool_choice` what it may call."""
    if sampling is not None and fields:
        raise TypeError(f"give sampling= or sampling fields ({sorted(fields)}), not both")
    asked = sampling if sampling is not None else Sampling.of(fields)
    if asked.seed is not None and not 0 <= asked.seed <= _UINT64_MAX:
        raise ValueError(f"seed must be an unsigned 64-bit integer, got {asked.seed}")
    request = pb.GenerateRequest(
        model=model,
        sampling=asked.to_proto(),
        priority=encode_priority(priority),
        request_id=request_id or "",
    )
    if constraint is not None:
        request.constraint.CopyFrom(constraint.to_proto())
    request.tools.extend(tool.to_proto() for tool in tools)
    if tool_choice is not None:
        request.tool_choice.CopyFrom(tool_choice.to_proto())
    if parallel_tool_calls is not None:
        request.parallel_tool_calls = parallel_tool_calls
    if isinstance(prompt, str):
        request.text = prompt
    elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, ChatMessage) for m in prompt):
        request.chat.messages.extend(
            pb.ChatMessage(
                role=m.role,
                content=m.content,
                tool_calls=[call.to_proto() for call in m.tool_calls],
                tool_call_id=m.tool_call_id,
                name=m.name,
            )
            for m in prompt
            if isinstance(m, ChatMessage)
        )
    elif isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        request.token_ids.ids.extend(int(t) for t in prompt if isinstance(t, int))
    else:
        raise TypeError(
            "prompt must be a str, a sequence of int token ids or of ChatMessage, "
            f"got {type(prompt).__name__}"
        )
    return request


def _seconds(duration: duration_pb2.Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def result_from_response(response: pb.InferResponse) -> InferResult:
    """The InferResult for a response; numeric outputs are read-only views of the response bytes."""
    return InferResult(
        outputs={tensor.name: decode_tensor(tensor) for tensor in response.outputs},
        model=response.model,
        model_version=response.model_version,
        queue_wait_s=_seconds(response.timings.queue_wait),
        compute_s=_seconds(response.timings.compute),
        batch_size=response.timings.batch_size,
        request_id=response.request_id,
    )


def chunk_from_response(response: pb.GenerateResponse) -> GenerationChunk:
    """The GenerationChunk for one streamed message."""
    error = None
    if response.HasField("error"):
        error = StreamError(
            code=status_code_from_number(response.error.code),
            message=response.error.message,
            reason=response.error.reason or None,
        )
    usage = None
    if response.HasField("usage"):
        usage = Usage(
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
            total_tokens=response.usage.total_tokens,
            cached_tokens=response.usage.cached_tokens,
        )
    return GenerationChunk(
        text=response.text,
        token_ids=list(response.token_ids),
        finish_reason=finish_reason_name(response.finish_reason),
        usage=usage,
        error=error,
        logprobs=[
            TokenLogprob(_probability(entry.chosen), [_probability(t) for t in entry.top])
            for entry in response.logprobs
        ],
        tool_calls=tuple(ToolCall.from_proto(call) for call in response.tool_calls),
    )


def _probability(probability: pb.TokenProbability) -> TokenProbability:
    return TokenProbability(probability.token_id, probability.token, probability.logprob)


def _spec(spec: pb.TensorSpec) -> TensorSpec:
    return TensorSpec(name=spec.name, dtype=dtype_name(spec.dtype), shape=tuple(spec.shape))


def model_info_from_proto(info: pb.ModelInfo) -> ModelInfo:
    """The ModelInfo for a model's metadata, with its limits flattened onto it."""
    return ModelInfo(
        name=info.name,
        version=info.version,
        kind=_MODEL_KINDS.get(info.kind, "unspecified"),
        description=info.description,
        inputs=[_spec(spec) for spec in info.inputs],
        outputs=[_spec(spec) for spec in info.outputs],
        max_batch_size=info.limits.max_batch_size,
        context_length=info.limits.context_length,
        max_tokens=info.limits.max_tokens,
        max_concurrent_sequences=info.limits.max_concurrent_sequences,
        device=info.device,
        dtype=info.dtype,
        quantization=info.quantization,
        parent=info.parent,
        lora_rank=info.lora_rank,
    )
