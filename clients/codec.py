"""numpy arrays and Python scalars <-> the protobuf `Tensor`, `Priority`, `FinishReason` and `ParameterValue`.

Numeric tensors travel as little-endian bytes in `raw_contents` and are decoded with `numpy.frombuffer`,
so a decoded output is a read-only view of the response's bytes, not a copy. Strings travel as typed
`string_contents`, since the contract forbids raw bytes for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from sluice.inference.v1 import inference_pb2 as pb

from clients.types import DType, FinishReason, OutputValue, ParameterScalar, PriorityName

__all__ = [
    "PRIORITIES",
    "WIRE_DTYPES",
    "InputValue",
    "decode_raw_contents",
    "decode_tensor",
    "dtype_name",
    "encode_parameters",
    "encode_priority",
    "encode_tensor",
    "finish_reason_name",
    "typed_contents",
]

InputValue = npt.NDArray[np.generic] | Sequence[str]

# Explicit little-endian dtypes: the wire format is little-endian whatever the host is.
WIRE_DTYPES: Mapping[pb.DataType.ValueType, np.dtype[np.generic]] = {
    pb.DATA_TYPE_FLOAT32: np.dtype("<f4"),
    pb.DATA_TYPE_FLOAT64: np.dtype("<f8"),
    pb.DATA_TYPE_FLOAT16: np.dtype("<f2"),
    pb.DATA_TYPE_INT32: np.dtype("<i4"),
    pb.DATA_TYPE_INT64: np.dtype("<i8"),
    pb.DATA_TYPE_BOOL: np.dtype("?"),
}
_DATA_TYPE_BY_KIND: dict[tuple[str, int], pb.DataType.ValueType] = {
    (dtype.kind, dtype.itemsize): data_type for data_type, dtype in WIRE_DTYPES.items()
}
_DTYPE_NAMES: dict[pb.DataType.ValueType, DType] = {
    pb.DATA_TYPE_UNSPECIFIED: "unspecified",
    pb.DATA_TYPE_FLOAT32: "float32",
    pb.DATA_TYPE_FLOAT64: "float64",
    pb.DATA_TYPE_FLOAT16: "float16",
    pb.DATA_TYPE_INT32: "int32",
    pb.DATA_TYPE_INT64: "int64",
    pb.DATA_TYPE_BOOL: "bool",
    pb.DATA_TYPE_STRING: "string",
}
PRIORITIES: Mapping[str, pb.Priority.ValueType] = {
    "low": pb.PRIORITY_LOW,
    "normal": pb.PRIORITY_NORMAL,
    "high": pb.PRIORITY_HIGH,
}
_FINISH_REASONS: dict[pb.FinishReason.ValueType, FinishReason] = {
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_ERROR: "error",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


def dtype_name(data_type: pb.DataType.ValueType) -> DType:
    """The short name ("float32", "string", ...) of a wire data type."""
    return _DTYPE_NAMES.get(data_type, "unspecified")


def finish_reason_name(reason: pb.FinishReason.ValueType) -> FinishReason | None:
    """The short name ("length", "stop", ...) of a finish reason; None while the generation goes on."""
    return _FINISH_REASONS.get(reason)


def encode_tensor(name: str, value: InputValue) -> pb.Tensor:
    """Encode a numpy array (numeric, bool or str) or a sequence of str as a named Tensor."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "US":
            return _string_tensor(name, [str(s) for s in value.ravel()], value.shape)
        return _raw_tensor(name, value)
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(
            f"input {name!r}: expected a numpy array or a sequence of str, got {type(value).__name__}"
        )
    if not all(isinstance(item, str) for item in value):
        raise TypeError(f"input {name!r}: a plain sequence must hold only str; pass numbers as a numpy array")
    return _string_tensor(name, list(value), (len(value),))


def _raw_tensor(name: str, array: npt.NDArray[np.generic]) -> pb.Tensor:
    data_type = _DATA_TYPE_BY_KIND.get((array.dtype.kind, array.dtype.itemsize))
    if data_type is None:
        supported = ", ".join(name for name in _DTYPE_NAMES.values() if name != "unspecified")
        raise ValueError(f"input {name!r}: dtype {array.dtype} is not supported; use one of: {supported}")
    # astype(copy=False) and ascontiguousarray are no-ops for the common little-endian, C-ordered case.
    wire = np.ascontiguousarray(array.astype(WIRE_DTYPES[data_type], copy=False))
    return pb.Tensor(name=name, dtype=data_type, shape=array.shape, raw_contents=wire.tobytes())


def _string_tensor(name: str, items: list[str], shape: tuple[int, ...]) -> pb.Tensor:
    return pb.Tensor(
        name=name,
        dtype=pb.DATA_TYPE_STRING,
        shape=shape,
        contents=pb.TensorContents(string_contents=items),
    )


def decode_tensor(tensor: pb.Tensor) -> OutputValue:
    """Decode a Tensor: STRING -> flat list[str]; numeric -> array of its shape, zero-copy when raw."""
    if tensor.dtype == pb.DATA_TYPE_STRING:
        return list(tensor.contents.string_contents)
    if tensor.raw_contents:
        return decode_raw_contents(tensor)
    dtype = _numeric_dtype(tensor)
    shape = tuple(tensor.shape)
    count = int(np.prod(shape, dtype=np.int64))
    typed = typed_contents(tensor)
    if len(typed) != count:
        raise ValueError(f"output {tensor.name!r}: {len(typed)} elements do not fill shape {list(shape)}")
    return np.asarray(typed, dtype=dtype).reshape(shape)


def decode_raw_contents(tensor: pb.Tensor) -> npt.NDArray[np.generic]:
    """A numeric tensor's little-endian `raw_contents` as an array of its shape: a read-only view, no copy."""
    dtype = _numeric_dtype(tensor)
    shape = tuple(tensor.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if len(tensor.raw_contents) != count * dtype.itemsize:
        raise ValueError(
            f"output {tensor.name!r}: {len(tensor.raw_contents)} raw bytes do not fill "
            f"shape {list(shape)} of {dtype_name(tensor.dtype)}"
        )
    return np.frombuffer(tensor.raw_contents, dtype=dtype).reshape(shape)


def _numeric_dtype(tensor: pb.Tensor) -> np.dtype[np.generic]:
    dtype = WIRE_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"output {tensor.name!r}: unsupported data type {tensor.dtype}")
    return dtype


def typed_contents(tensor: pb.Tensor) -> Sequence[float] | Sequence[int] | Sequence[bool]:
    """The typed-contents field a numeric tensor's elements are in (FLOAT16 travels as fp32_contents)."""
    contents = tensor.contents
    if tensor.dtype in (pb.DATA_TYPE_FLOAT32, pb.DATA_TYPE_FLOAT16):
        return contents.fp32_contents
    if tensor.dtype == pb.DATA_TYPE_FLOAT64:
        return contents.fp64_contents
    if tensor.dtype == pb.DATA_TYPE_INT32:
        return contents.int32_contents
    if tensor.dtype == pb.DATA_TYPE_INT64:
        return contents.int64_contents
    return contents.bool_contents


def encode_priority(priority: PriorityName | None) -> pb.Priority.ValueType:
    """Map "low" / "normal" / "high" to the wire enum; None leaves it unspecified (served as normal)."""
    if priority is None:
        return pb.PRIORITY_UNSPECIFIED
    try:
        return PRIORITIES[priority]
    except KeyError:
        raise ValueError(f"priority must be one of 'low', 'normal', 'high', got {priority!r}") from None


def encode_parameters(parameters: Mapping[str, ParameterScalar] | None) -> dict[str, pb.ParameterValue]:
    """Wrap per-request parameters in ParameterValue messages, choosing the oneof by Python type."""
    encoded: dict[str, pb.ParameterValue] = {}
    for key, value in (parameters or {}).items():
        # bool first: it is a subclass of int, and must not become int64_value.
        if isinstance(value, bool):
            encoded[key] = pb.ParameterValue(bool_value=value)
        elif isinstance(value, int):
            encoded[key] = pb.ParameterValue(int64_value=value)
        elif isinstance(value, float):
            encoded[key] = pb.ParameterValue(double_value=value)
        elif isinstance(value, str):
            encoded[key] = pb.ParameterValue(string_value=value)
        else:
            raise TypeError(
                f"parameter {key!r}: expected bool, int, float or str, got {type(value).__name__}"
            )
    return encoded
