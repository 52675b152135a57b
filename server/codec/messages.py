"""Request/response messages <-> domain types: InferItem, GenerateSpec, TokenChunk, ModelDescriptor."""

from __future__ import annotations

import dataclasses

import grpc
from google.protobuf import duration_pb2
from sluice.inference.v1 import inference_pb2 as pb

from server.codec.constraints import decode_constraint, decode_tool_calls, decode_tools
from server.codec.tensors import TO_PB, decode_tensor, fill_tensor
from server.domain import (
    ChatTurn,
    FinishReason,
    GenerateSpec,
    InferItem,
    InferResult,
    ModelDescriptor,
    ModelKind,
    Priority,
    TensorSpec,
    TokenChunk,
    TokenProbability,
)
from server.errors import InvalidArgument, LimitExceeded, clip
from wire.sampling import Sampling

_PRIORITY: dict[int, Priority] = {
    pb.PRIORITY_UNSPECIFIED: Priority.NORMAL,
    pb.PRIORITY_LOW: Priority.LOW,
    pb.PRIORITY_NORMAL: Priority.NORMAL,
    pb.PRIORITY_HIGH: Priority.HIGH,
}
_FINISH = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
    FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS,
}
_NANOS = 1_000_000_000
_KIND = {ModelKind.TENSOR: pb.MODEL_KIND_TENSOR, ModelKind.GENERATIVE: pb.MODEL_KIND_GENERATIVE}
_REQUEST = pb.GenerateRequest.DESCRIPTOR.fields_by_name
# GenerateSpec's fields that the request holds as plain values of the same name (a string, a number, a bool:
# not repeated, no message, no enum, no presence): copied by name, so a value a request carries to the
# scheduler (a per-request extra) is a proto field and a GenerateSpec field, with no line here.
_ALIKE = tuple(
    spec.name
    for spec in dataclasses.fields(GenerateSpec)
    if (proto := _REQUEST.get(spec.name)) is not None
    and not (proto.is_repeated or proto.message_type or proto.enum_type or proto.has_presence)
)


def decode_priority(value: int) -> Priority:
    try:
        return _PRIORITY[value]
    except KeyError:
        raise InvalidArgument(f"unknown priority {value}", field="priority") from None


def decode_infer(request: pb.InferRequest) -> InferItem:
    if not request.model:
        raise InvalidArgument("model must be set", field="model")
    if not request.inputs:
        raise InvalidArgument("inputs must hold at least one tensor", field="inputs")
    inputs = {}
    for index, tensor in enumerate(request.inputs):
        if tensor.name in inputs:
            raise InvalidArgument(f"input {clip(tensor.name)!r} appears twice", field=f"inputs[{index}].name")
        inputs[tensor.name] = decode_tensor(tensor, f"inputs[{index}]")
    return InferItem(
        model=request.model,
        inputs=inputs,
        priority=decode_priority(request.priority),
        request_id=request.request_id,
        typed_outputs=request.typed_outputs,
    )


def encode_infer(model: str, request_id: str, result: InferResult, *, typed: bool) -> pb.InferResponse:
    """Fills the response in place: submessages built apart are copied in whole when handed over."""
    out = pb.InferResponse(model=model, model_version=result.model_version, request_id=request_id)
    for name, array in result.outputs.items():
        fill_tensor(out.outputs.add(), name, array, typed=typed)
    timings = out.timings
    _set_duration(timings.queue_wait, result.queue_wait_s)
    _set_duration(timings.compute, result.compute_s)
    timings.batch_size = result.batch_size
    return out


def decode_generate(request: pb.GenerateRequest) -> GenerateSpec:
    """Checks what needs no model; limits that depend on the model are checked by the scheduler."""
    if not request.model:
        raise InvalidArgument("model must be set", field="model")
    which = request.WhichOneof("prompt")
    if which is None:
        raise InvalidArgument("set the prompt as text, token_ids or chat", field="text")
    if which == "text" and not request.text:
        raise InvalidArgument("prompt text is empty", field="text")
    if which == "token_ids" and not request.token_ids.ids:
        raise InvalidArgument("token_ids is empty", field="token_ids.ids")
    chat = decode_chat(request.chat) if which == "chat" else None
    sampling = decode_sampling(request.sampling)
    tools, tool_choice = decode_tools(request)
    return GenerateSpec(
        **{name: getattr(request, name) for name in _ALIKE},
        prompt_text=request.text if which == "text" else None,
        prompt_ids=tuple(request.token_ids.ids) if which == "token_ids" else None,
        prompt_chat=chat,
        sampling=sampling,
        priority=decode_priority(request.priority),
        constraint=decode_constraint(request),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=not request.HasField("parallel_tool_calls") or request.parallel_tool_calls,
    )


_ROLES = frozenset(("system", "user", "assistant", "tool"))


def decode_chat(chat: pb.ChatPrompt) -> tuple[ChatTurn, ...]:
    """A Generate's (or a Tokenize's) conversation: roles known, each call named."""
    if not chat.messages:
        raise InvalidArgument("chat holds no messages", field="chat.messages")
    turns = []
    for index, message in enumerate(chat.messages):
        if message.role not in _ROLES:
            raise InvalidArgument(
                f"role must be system, user, assistant or tool, got {clip(message.role)!r}",
                field=f"chat.messages[{index}].role",
            )
        calls = decode_tool_calls(list(message.tool_calls), f"chat.messages[{index}].tool_calls")
        turns.append(ChatTurn(message.role, message.content, calls, message.tool_call_id, message.name))
    return tuple(turns)


def decode_sampling(message: pb.SamplingParams) -> Sampling:
    """The settings as asked, each within the range wire/sampling.py declares for it; the first one outside
    is refused naming `sampling.<field>` (LIMIT_EXCEEDED where a count is past its limit)."""
    sampling = Sampling.from_proto(message)
    problem = sampling.violation()
    if problem is None:
        return sampling
    if problem.limit is None:
        raise InvalidArgument(problem.message, field=f"sampling.{problem.field}")
    raise LimitExceeded(problem.message, field=f"sampling.{problem.field}", metadata=problem.limit)


def encode_chunk(chunk: TokenChunk) -> pb.GenerateResponse:
    out = pb.GenerateResponse(text=chunk.text, token_ids=chunk.token_ids)
    for entry in chunk.logprobs:
        logprob = out.logprobs.add()
        _probability(logprob.chosen, entry.chosen)
        for alternative in entry.top:
            _probability(logprob.top.add(), alternative)
    if chunk.finish_reason is not None:
        out.finish_reason = _FINISH[chunk.finish_reason]
    if chunk.usage is not None:
        out.usage.prompt_tokens = chunk.usage.prompt_tokens
        out.usage.completion_tokens = chunk.usage.completion_tokens
        out.usage.total_tokens = chunk.usage.total_tokens
        out.usage.cached_tokens = chunk.usage.cached_tokens
    out.tool_calls.extend(call.to_proto() for call in chunk.tool_calls)
    if chunk.stop_sequence and chunk.finish_reason is FinishReason.STOP:
        out.stop_sequence = chunk.stop_sequence
    if chunk.timings is not None:
        t = chunk.timings
        out.timings.queue_wait.FromNanoseconds(int(t.queue_wait_s * 1e9))
        out.timings.time_to_first_token.FromNanoseconds(int(t.time_to_first_token_s * 1e9))
        out.timings.decode.FromNanoseconds(int(t.decode_s * 1e9))
        out.timings.tokens, out.timings.first_step = t.tokens, t.first_step
        out.timings.batch_size = t.batch_size
    if chunk.error is not None:
        out.error.code = grpc.StatusCode[chunk.error.code].value[0]
        out.error.message = chunk.error.message
        out.error.reason = chunk.error.reason
    return out


def _probability(out: pb.TokenProbability, probability: TokenProbability) -> None:
    out.token_id, out.token, out.logprob = probability.token_id, probability.token, probability.logprob


def encode_model(descriptor: ModelDescriptor) -> pb.ModelInfo:
    limits = descriptor.limits
    return pb.ModelInfo(
        name=descriptor.name,
        version=descriptor.version,
        kind=_KIND[descriptor.kind],
        description=descriptor.description,
        inputs=[_spec(s) for s in descriptor.inputs],
        outputs=[_spec(s) for s in descriptor.outputs],
        limits=pb.ModelLimits(
            max_batch_size=limits.max_batch_size,
            context_length=limits.context_length,
            max_tokens=limits.max_tokens,
            max_concurrent_sequences=limits.max_concurrent_sequences,
        ),
        device=descriptor.device,
        dtype=descriptor.dtype,
        quantization=descriptor.quantization,
    )


def _spec(spec: TensorSpec) -> pb.TensorSpec:
    return pb.TensorSpec(name=spec.name, dtype=TO_PB[spec.dtype], shape=spec.shape)


def _duration(seconds: float) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    _set_duration(out, seconds)
    return out


def _set_duration(out: duration_pb2.Duration, seconds: float) -> None:
    """Duration.FromNanoseconds' arithmetic, written out: its two Python calls were a part of each Infer."""
    whole, nanos = divmod(int(seconds * 1e9), _NANOS)
    if whole < 0 and nanos > 0:  # protobuf's rule: nanos takes the sign of seconds
        whole, nanos = whole + 1, nanos - _NANOS
    out.seconds, out.nanos = whole, nanos
