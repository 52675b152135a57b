"""v2 requests -> domain: a ModelInferRequest for a tensor model becomes one InferItem per row of its batch
(ModelConfig reports the batch dimension, as Triton's does), and one for a Generate model becomes a
GenerateSpec. Errors are INVALID_ARGUMENT naming the input (`inputs[0].shape`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb
from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.codec.messages import decode_generate, decode_priority
from server.codec.tensors import check_shape
from server.domain import Array, GenerateSpec, InferItem, ModelDescriptor, TensorSpec
from server.errors import InvalidArgument, clip
from server.kserve.calls import V2Call, parameter
from server.kserve.datatypes import TO_V2
from server.kserve.tensors import Buffer, domain_dtype, from_contents, from_raw, input_dtype
from wire.sampling import FIELDS, Sampling

# Reads `byte_size` bytes at `offset` of a registered region for the input at `path` (server/kserve/shm.py).
ReadRegion = Callable[[str, int, int, str], Buffer]
SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_SIZE = "shared_memory_byte_size"
#: The Generate model's one input: the prompt, as the Triton LLM backends (vLLM, TensorRT-LLM) name it.
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"


@dataclass(frozen=True, slots=True)
class InferBatch:
    """One v2 request to a tensor model: its rows, and the outputs asked for (None: all)."""

    items: list[InferItem]
    requested: list[str] | None


def decode_infer(call: V2Call, descriptor: ModelDescriptor, read_region: ReadRegion | None) -> InferBatch:
    """Checks names, datatypes and shapes against the descriptor, as TensorModel.validate does for Sluice's
    own Infer (with the batch dimension), so the rows need no second check."""
    message = call.message
    arrays = decode_inputs(message, read_region)
    specs = _specs(descriptor)
    max_batch = descriptor.limits.max_batch_size
    rows = 0
    for index, (name, array) in enumerate(arrays.items()):
        path = f"inputs[{index}]"
        spec = specs.get(name)
        if spec is None:
            raise InvalidArgument(
                f"unknown input {clip(name)!r}; expected {sorted(specs)}", field=f"{path}.name"
            )
        if spec.dtype is not domain_dtype(array):
            raise InvalidArgument(
                f"input {name!r} must be {TO_V2[spec.dtype]}, got {TO_V2[domain_dtype(array)]}",
                field=f"{path}.datatype",
            )
        shape = array.shape
        want = (-1, *spec.shape)
        if shape[1:] != spec.shape and (  # the fixed-shape fast path; else -1 matches any size
            len(shape) != len(want) or any(w not in (-1, g) for w, g in zip(want, shape, strict=True))
        ):
            raise InvalidArgument(
                f"input {name!r} must have shape {list(want)} (the first dimension is the batch), "
                f"got {list(shape)}",
                field=f"{path}.shape",
            )
        if shape[0] > max_batch:
            raise InvalidArgument(
                f"input {name!r} holds a batch of {shape[0]}; max_batch_size is {max_batch}",
                field=f"{path}.shape",
            )
        if rows and shape[0] != rows:
            raise InvalidArgument(
                f"input {name!r} holds a batch of {shape[0]}, the other inputs {rows}", field=f"{path}.shape"
            )
        rows = shape[0]
    for name in specs:
        if name not in arrays:
            raise InvalidArgument(f"missing input {name!r}", field="inputs")
    priority = decode_priority(call.priority)
    model, request_id = message.model_name, message.id
    items = [
        InferItem(model, {name: array[row] for name, array in arrays.items()}, priority, request_id)
        for row in range(rows)
    ]
    return InferBatch(items, requested_outputs(message, descriptor) if message.outputs else None)


_SPECS: dict[int, tuple[ModelDescriptor, dict[str, TensorSpec]]] = {}


def _specs(descriptor: ModelDescriptor) -> dict[str, TensorSpec]:
    """A model's inputs by name, built once per model rather than per request (keyed by identity: hashing
    the frozen descriptor costs more than building the dict)."""
    found = _SPECS.get(id(descriptor))
    if found is None or found[0] is not descriptor:
        found = _SPECS[id(descriptor)] = (descriptor, {spec.name: spec for spec in descriptor.inputs})
    return found[1]


def requested_outputs(message: v2.ModelInferRequest, descriptor: ModelDescriptor) -> list[str] | None:
    if not message.outputs:
        return None
    known = [spec.name for spec in descriptor.outputs]
    names = []
    for index, output in enumerate(message.outputs):
        if output.name not in known:
            raise InvalidArgument(
                f"unknown output {clip(output.name)!r}; expected {known}", field=f"outputs[{index}].name"
            )
        if parameter(output.parameters, SHM_REGION) is not None:
            raise InvalidArgument(
                "outputs travel in the response; shared memory takes inputs only",
                field=f"outputs[{index}].parameters",
            )
        names.append(output.name)
    return names


def decode_inputs(message: v2.ModelInferRequest, read_region: ReadRegion | None) -> dict[str, Array]:
    """Each input by name, from contents, raw_input_contents (in order, skipping inputs that travel
    otherwise, as tritonclient builds them) or shared memory."""
    if not message.model_name:
        raise InvalidArgument("model_name must be set", field="model_name")
    if not message.inputs:
        raise InvalidArgument("inputs must hold at least one tensor", field="inputs")
    raw = message.raw_input_contents
    arrays: dict[str, Array] = {}
    next_raw = 0
    for index, tensor in enumerate(message.inputs):
        path = f"inputs[{index}]"
        if tensor.name in arrays:
            raise InvalidArgument(f"input {clip(tensor.name)!r} appears twice", field=f"{path}.name")
        dtype = input_dtype(tensor.datatype, path)
        region = parameter(tensor.parameters, SHM_REGION)
        if region is not None:
            shape = check_shape(tensor.shape, path)
            data = _shared(tensor, str(region), path, read_region)
            arrays[tensor.name] = from_raw(data, dtype, shape, path, where=f"{path}.parameters.{SHM_REGION}")
        elif tensor.HasField("contents"):
            if raw:
                raise InvalidArgument(
                    "set raw_input_contents or each input's contents, not both", field=f"{path}.contents"
                )
            arrays[tensor.name] = from_contents(tensor, dtype, path)
        else:
            if next_raw >= len(raw):
                raise InvalidArgument(
                    f"{path} has no data: no contents and no raw_input_contents[{next_raw}]",
                    field="raw_input_contents",
                )
            where = f"raw_input_contents[{next_raw}]"
            arrays[tensor.name] = from_raw(
                raw[next_raw], dtype, check_shape(tensor.shape, path), path, where=where
            )
            next_raw += 1
    if next_raw != len(raw):
        raise InvalidArgument(
            f"raw_input_contents holds {len(raw)} entries for {next_raw} inputs", field="raw_input_contents"
        )
    return arrays


def _shared(
    tensor: v2.ModelInferRequest.InferInputTensor, region: str, path: str, read_region: ReadRegion | None
) -> Buffer:
    if read_region is None:
        raise InvalidArgument(f"{path}: shared memory is not served here", field=f"{path}.parameters")
    offset = parameter(tensor.parameters, SHM_OFFSET) or 0
    size = parameter(tensor.parameters, SHM_SIZE)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidArgument(
            f"{path}.parameters.{SHM_OFFSET} must be an integer >= 0", field=f"{path}.parameters"
        )
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise InvalidArgument(
            f"{path}.parameters.{SHM_SIZE} must be an integer > 0", field=f"{path}.parameters"
        )
    return read_region(region, offset, size, path)


def decode_generate_call(call: V2Call) -> GenerateSpec:
    """The prompt is the BYTES input `text_input` (one element); sampling settings come from inputs or
    request parameters of the same names as Sluice's (max_tokens, temperature, top_p, top_k, seed, ...)."""
    message = call.message
    arrays = decode_inputs(message, None)
    prompt = arrays.get(TEXT_INPUT)
    if prompt is None or prompt.dtype != object or prompt.size != 1:
        raise InvalidArgument(
            f"a Generate model takes one BYTES element in input {TEXT_INPUT!r}", field="inputs"
        )
    values: dict[str, Any] = {}
    for name in sorted(FIELDS - {"stop"}):
        value: Any = parameter(message.parameters, name)
        if value is None and name in arrays and arrays[name].size == 1:
            value = arrays[name].reshape(-1)[0].item()
        if value is not None:
            values[name] = value
    stop = parameter(message.parameters, "stop")
    if isinstance(stop, str) and stop:
        values["stop"] = stop
    try:
        sampling = Sampling.of(values).to_proto()
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"parameters: {exc}", field="parameters") from exc
    request = pb.GenerateRequest(
        model=message.model_name, text=str(prompt.reshape(-1)[0]), sampling=sampling,
        priority=call.priority, request_id=message.id,
    )  # fmt: skip
    return decode_generate(request)
