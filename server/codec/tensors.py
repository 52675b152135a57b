"""Tensor <-> numpy: raw little-endian bytes are decoded with numpy.frombuffer, without a copy."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sluice.inference.v1 import inference_pb2 as pb

from server.domain import Array, DType
from server.errors import InvalidArgument, clip

_FROM_PB = {
    pb.DATA_TYPE_FLOAT32: DType.FLOAT32,
    pb.DATA_TYPE_FLOAT64: DType.FLOAT64,
    pb.DATA_TYPE_FLOAT16: DType.FLOAT16,
    pb.DATA_TYPE_INT32: DType.INT32,
    pb.DATA_TYPE_INT64: DType.INT64,
    pb.DATA_TYPE_BOOL: DType.BOOL,
    pb.DATA_TYPE_STRING: DType.STRING,
}
TO_PB = {v: k for k, v in _FROM_PB.items()}
_TYPED_FIELD = {
    DType.FLOAT32: "fp32_contents",
    DType.FLOAT16: "fp32_contents",
    DType.FLOAT64: "fp64_contents",
    DType.INT32: "int32_contents",
    DType.INT64: "int64_contents",
    DType.BOOL: "bool_contents",
    DType.STRING: "string_contents",
}
#: numpy arrays have at most 64 dimensions; no model here needs more than a few.
MAX_DIMS = 32
_NUMPY_TO_DTYPE = {d.numpy: d for d in DType if d is not DType.STRING}
# The same tables keyed by the wire's integer and numpy's dtype, so that a call's tensors are decoded and
# encoded without an enum hash or the DType.numpy property (each a Python call, several per request).
_NUMPY_OF_PB = {code: dtype.numpy for code, dtype in _FROM_PB.items() if dtype is not DType.STRING}
_PB_OF_NUMPY = {numpy: TO_PB[dtype] for numpy, dtype in _NUMPY_TO_DTYPE.items()}
_TYPED_OF_PB = {TO_PB[dtype]: name for dtype, name in _TYPED_FIELD.items()}


def check_shape(shape: Sequence[int], path: str) -> tuple[int, ...]:
    """An input's shape, refused naming `{path}.shape` when too deep, negative or empty (both protocols)."""
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(
            f"{path}.shape has {len(shape)} dimensions; at most {MAX_DIMS} are supported",
            field=f"{path}.shape",
        )
    dims = tuple(shape)
    if dims and min(dims) <= 0:  # one C call for the common shape (a generator here cost two Python calls)
        if min(dims) < 0:
            raise InvalidArgument(
                f"{path}.shape has a negative dimension: {clip(list(shape))}", field=f"{path}.shape"
            )
        raise InvalidArgument(f"{path} is empty (shape {clip(list(shape))})", field=f"{path}.shape")
    return dims


def decode_tensor(tensor: pb.Tensor, path: str) -> Array:
    """Decodes one request tensor; errors name the offending field, e.g. `inputs[0].shape`."""
    code = tensor.dtype
    dtype = _FROM_PB.get(code)
    if dtype is None:
        raise InvalidArgument(f"{path}.dtype must be set to a supported DataType", field=f"{path}.dtype")
    shape = check_shape(tensor.shape, path)
    count = math.prod(shape)
    typed_name = _TYPED_OF_PB[code]
    raw = tensor.raw_contents  # read once: each read of a bytes field builds a new object
    if raw:
        if dtype is DType.STRING:
            raise InvalidArgument("STRING tensors use contents.string_contents", field=f"{path}.raw_contents")
        if tensor.HasField("contents") and len(getattr(tensor.contents, typed_name)):
            raise InvalidArgument("set raw_contents or contents, not both", field=f"{path}.raw_contents")
        numpy_dtype = _NUMPY_OF_PB[code]
        expected = count * numpy_dtype.itemsize
        if len(raw) != expected:
            raise InvalidArgument(
                f"{path}.raw_contents holds {len(raw)} bytes; shape {clip(list(shape))} of "
                f"{dtype.name} needs {expected}",
                field=f"{path}.raw_contents",
            )
        array = np.frombuffer(raw, dtype=numpy_dtype)
        return array if len(shape) == 1 else array.reshape(shape)
    values = getattr(tensor.contents, typed_name)
    if len(values) != count:
        raise InvalidArgument(
            f"{path}.contents.{typed_name} holds {len(values)} values; "
            f"shape {clip(list(shape))} needs {count}",
            field=f"{path}.contents.{typed_name}",
        )
    if dtype is DType.STRING:
        return np.array(list(values), dtype=object).reshape(shape)
    return np.asarray(values, dtype=dtype.numpy).reshape(shape)


def encode_tensor(name: str, array: Array, *, typed: bool) -> pb.Tensor:
    """Encodes one output; raw bytes by default (one copy, from the output buffer into the message)."""
    out = pb.Tensor()
    fill_tensor(out, name, array, typed=typed)
    return out


def fill_tensor(out: pb.Tensor, name: str, array: Array, *, typed: bool) -> None:
    """Writes one output into `out`, a tensor already in its response (`outputs.add()`): building it apart
    and handing it to the response copied it whole, bytes and all."""
    out.name = name
    out.shape.extend(array.shape)
    if array.dtype == object:
        out.dtype = pb.DATA_TYPE_STRING
        out.contents.string_contents.extend(str(v) for v in array.reshape(-1))
        return
    numpy_dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    code = _PB_OF_NUMPY[numpy_dtype]
    out.dtype = code
    if typed:
        getattr(out.contents, _TYPED_OF_PB[code]).extend(array.reshape(-1).tolist())
    else:
        out.raw_contents = np.ascontiguousarray(array, dtype=numpy_dtype).tobytes()
