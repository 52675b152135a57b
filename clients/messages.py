"""Request messages from call arguments, and result dataclasses from response messages.

The one request builder: shared by the sync and asyncio clients, so that both are only thin wrappers
around the stub calls, and by the shim, which builds the same messages from JSON bodies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

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
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    stop: Sequence[str] | None,
    priority: PriorityName | None,
    request_id: str | None,
    min_tokens: int | None = None,
    ignore_eos: bool = False,
    logprobs: int | None = None,
) -> pb.GenerateRequest:
    """The GenerateRequest; unset sampling options stay unset so that the server's defaults apply."""
    sampling = pb.SamplingParams(stop=[stop] if isinstance(stop, str) else list(stop or ()))
    # Presence matters for these proto3 `optional` fields: only set what the caller gave.
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    if temperature is not None:
        sampling.temperature = temperature
    if top_p is not None:
        sampling.top_p = top_p
    if top_k is not None:
        sampling.top_k = top_k
    if seed is not None:
        if not 0 <= seed <= _UINT64_MAX:
            raise ValueError(f"seed must be an unsigned 64-bit integer, got {seed}")
        sampling.seed = seed
    if min_tokens is not None:
        sampling.min_tokens = min_tokens
    if ignore_eos:
        sampling.ignore_eos = True
    if logprobs is not None:
        sampling.logprobs = logprobs
    request = pb.GenerateRequest(
        model=model,
        sampling=sampling,
        priority=encode_priority(priority),
        request_id=request_id or "",
    )
    if isinstance(prompt, str):
        request.text = prompt
    elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, ChatMessage) for m in prompt):
        request.chat.messages.extend(
            pb.ChatMessage(role=m.role, content=m.content) for m in prompt if isinstance(m, ChatMessage)
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
    )
