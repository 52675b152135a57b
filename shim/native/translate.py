"""JSON <-> protobuf for the native family: tensors, sampling, usage, model metadata,
and the renaming of the server's proto field paths to the JSON names the HTTP caller sent."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import duration_pb2, json_format
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import WIRE_DTYPES, decode_raw_contents, typed_contents
from clients.messages import build_generate_request, infer_request
from clients.types import PriorityName
from shim.errors import FieldViolation
from shim.identity import current_request_id
from shim.native.request_models import GenerateBody, InferBody, Scalar, TensorIn
from shim.refusals import invalid_argument

DTYPE_BY_NAME: Mapping[str, pb.DataType.ValueType] = {
    "FLOAT32": pb.DATA_TYPE_FLOAT32,
    "FLOAT64": pb.DATA_TYPE_FLOAT64,
    "FLOAT16": pb.DATA_TYPE_FLOAT16,
    "INT32": pb.DATA_TYPE_INT32,
    "INT64": pb.DATA_TYPE_INT64,
    "BOOL": pb.DATA_TYPE_BOOL,
    "STRING": pb.DATA_TYPE_STRING,
}
NAME_BY_DTYPE: Mapping[pb.DataType.ValueType, str] = {value: name for name, value in DTYPE_BY_NAME.items()}

# Proto paths whose JSON name differs; `inputs[i].` prefixes are kept and the rest renamed.
_JSON_FIELD_BY_PROTO: Mapping[str, str] = {
    "text": "prompt",
    "token_ids": "prompt_token_ids",
    "token_ids.ids": "prompt_token_ids",
    "raw_contents": "data_b64",
    "contents": "data",
}
_INPUT_PATH = re.compile(r"^(inputs\[\d+\])\.(.+)$")
_FLOAT_TYPES = (pb.DATA_TYPE_FLOAT32, pb.DATA_TYPE_FLOAT64, pb.DATA_TYPE_FLOAT16)


def json_field_for(proto_path: str) -> str:
    """The JSON field an HTTP caller sent for a server-side proto path, e.g. `sampling.top_p` -> `top_p`."""
    if proto_path.startswith("sampling."):
        return proto_path.removeprefix("sampling.")
    if match := _INPUT_PATH.match(proto_path):
        prefix, rest = match.groups()
        head = rest.split(".", 1)[0]
        return f"{prefix}.{_JSON_FIELD_BY_PROTO.get(head, rest)}"
    return _JSON_FIELD_BY_PROTO.get(proto_path, proto_path)


# What a JSON list may hold for each dtype (by exact type: `true` is a bool, never the number 1), and the
# little-endian numpy type it is packed as; the list goes over the wire as raw bytes, packed by numpy in one
# call instead of element by element (a 512-float list: 110 -> 15 us).
_ELEMENTS: Mapping[str, tuple[frozenset[type], str | None]] = {
    "FLOAT32": (frozenset((int, float)), "<f4"),
    "FLOAT16": (frozenset((int, float)), "<f2"),
    "FLOAT64": (frozenset((int, float)), "<f8"),
    "INT32": (frozenset((int,)), "<i4"),
    "INT64": (frozenset((int,)), "<i8"),
    "BOOL": (frozenset((bool,)), "|b1"),
    "STRING": (frozenset((str,)), None),
}


def _packed(data: Sequence[Scalar], dtype: str, field: str) -> bytes | None:
    """The elements as raw bytes (None for STRING, which has no raw form); 400 naming the field for an
    element of the wrong kind or out of the dtype's range."""
    accepted, packing = _ELEMENTS[dtype]
    if not accepted.issuperset(map(type, data)):
        wrong = next(value for value in data if type(value) not in accepted)
        raise invalid_argument(
            f"{field} holds {wrong!r}, which is not a {dtype} element",
            reason="INVALID_TENSOR_DATA",
            violations=(FieldViolation(field, f"elements must be {dtype}"),),
        )
    if packing is None:
        return None
    try:
        # A float past FLOAT32's range becomes infinity there, as protobuf's `float` field would make it.
        with np.errstate(over="ignore"):
            return np.asarray(data, dtype=packing).tobytes()
    except (OverflowError, ValueError) as exc:
        raise invalid_argument(
            f"{field} holds a value out of range for {dtype}",
            reason="INVALID_TENSOR_DATA",
            violations=(FieldViolation(field, str(exc)),),
        ) from exc


def tensor_to_proto(tensor: TensorIn, index: int) -> pb.Tensor:
    """One JSON input tensor as a protobuf Tensor, typed contents or raw bytes as the caller sent."""
    dtype = DTYPE_BY_NAME[tensor.dtype]
    message = pb.Tensor(name=tensor.name, dtype=dtype, shape=tensor.shape)
    expected = math.prod(tensor.shape)
    if tensor.data_b64 is not None:
        field = f"inputs[{index}].data_b64"
        try:
            raw = base64.b64decode(tensor.data_b64, validate=True)
        except ValueError as exc:  # binascii.Error, or a str that is not ASCII
            raise invalid_argument(
                f"{field} is not valid base64",
                reason="INVALID_TENSOR_DATA",
                violations=(FieldViolation(field, "must be base64 of little-endian elements"),),
            ) from exc
        itemsize = WIRE_DTYPES[dtype].itemsize
        if len(raw) != expected * itemsize:
            raise _count_mismatch(field, f"{len(raw)} bytes", f"{expected * itemsize} bytes", tensor.shape)
        message.raw_contents = raw
        return message
    field = f"inputs[{index}].data"
    data = tensor.data if tensor.data is not None else []
    if len(data) != expected:
        raise _count_mismatch(field, f"{len(data)} elements", f"{expected}", tensor.shape)
    packed = _packed(data, tensor.dtype, field)
    if packed is None:
        message.contents.string_contents.extend(str(value) for value in data)  # checked: all str
    else:
        message.raw_contents = packed
    return message


def _count_mismatch(field: str, got: str, expected: str, shape: Sequence[int]) -> Exception:
    return invalid_argument(
        f"{field} has {got} but shape {list(shape)} needs {expected}",
        reason="SHAPE_MISMATCH",
        violations=(FieldViolation(field, f"must hold {expected} for shape {list(shape)}"),),
    )


def infer_request_to_proto(body: InferBody, *, priority: PriorityName | None) -> pb.InferRequest:
    """The InferRequest for a JSON body (clients.messages builds it); outputs come back as raw bytes."""
    tensors = [tensor_to_proto(tensor, index) for index, tensor in enumerate(body.inputs)]
    try:
        return infer_request(
            body.model,
            tensors,
            priority=priority,
            request_id=body.request_id or current_request_id(),
            parameters=body.parameters,
        )
    except ValueError as exc:
        raise invalid_argument(
            "a parameter is out of range",
            reason="INVALID_PARAMETER",
            violations=(FieldViolation("parameters", str(exc)),),
        ) from exc


def _json_floats(values: list[Any]) -> list[Any]:
    # JSON has no NaN or Infinity; proto3's JSON mapping writes them as these strings.
    return [value if math.isfinite(value) else _NON_FINITE[str(value)] for value in values]


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def tensor_to_json(tensor: pb.Tensor) -> dict[str, Any]:
    """One output tensor as JSON-ready values, read from raw bytes when present, else from typed contents.

    Raw numeric data stays a numpy array: jsonio writes it natively, float32 at float32 precision (half
    the bytes of float64 digits, and no Python float per element).
    """
    data: list[Any] | np.ndarray[Any, Any]
    if tensor.dtype == pb.DATA_TYPE_STRING:
        data = list(tensor.contents.string_contents)
    elif tensor.dtype not in WIRE_DTYPES:
        data = []
    elif tensor.raw_contents:
        data = decode_raw_contents(tensor).ravel()
        if data.dtype.kind == "f" and not np.isfinite(data).all():
            data = _json_floats(data.tolist())
    else:
        data = list(typed_contents(tensor))
        if tensor.dtype in _FLOAT_TYPES and not all(map(math.isfinite, data)):
            data = _json_floats(data)
    return {
        "name": tensor.name,
        "dtype": NAME_BY_DTYPE.get(tensor.dtype, "DATA_TYPE_UNSPECIFIED"),
        "shape": list(tensor.shape),
        "data": data,
    }


def _milliseconds(duration: duration_pb2.Duration) -> float:
    return duration.seconds * 1000.0 + duration.nanos / 1e6


def infer_response_to_json(response: pb.InferResponse) -> dict[str, Any]:
    return {
        "model": response.model,
        "model_version": response.model_version,
        "request_id": response.request_id,
        "outputs": [tensor_to_json(tensor) for tensor in response.outputs],
        "timings": {
            "queue_wait_ms": _milliseconds(response.timings.queue_wait),
            "compute_ms": _milliseconds(response.timings.compute),
            "batch_size": response.timings.batch_size,
        },
    }


def generate_request_to_proto(body: GenerateBody, *, priority: PriorityName | None) -> pb.GenerateRequest:
    """The GenerateRequest for a JSON body (clients.messages builds it); unset sampling stays unset."""
    prompt = body.prompt if body.prompt is not None else body.prompt_token_ids or []
    return build_generate_request(
        body.model,
        prompt,
        sampling=body.to_sampling(),
        priority=priority,
        request_id=body.request_id or current_request_id(),
        constraint=body.constraint.to_constraint() if body.constraint is not None else None,
    )


def usage_to_json(usage: pb.Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.cached_tokens,
    }


def model_info_to_json(info: pb.ModelInfo) -> dict[str, Any]:
    """ModelInfo in proto3 JSON, with field names as in the .proto and zero values included."""
    return json_format.MessageToDict(
        info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
