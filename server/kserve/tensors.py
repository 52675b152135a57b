"""v2 tensors <-> numpy: an input from its typed `contents`, from its `raw_input_contents` entry (little
endian, read in place with numpy.frombuffer) or from a shared-memory region; an output as raw bytes, as
Triton answers over gRPC. BYTES elements travel raw as a 4-byte little-endian length and the bytes."""

from __future__ import annotations

import math
import struct

import numpy as np
from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.codec.tensors import check_shape
from server.domain import Array, DType
from server.errors import InvalidArgument, clip
from server.kserve.datatypes import CONTENTS, FROM_V2, PROTOCOL, TO_V2

_LENGTH = struct.Struct("<I")
Buffer = bytes | memoryview


def input_dtype(datatype: str, path: str) -> DType:
    dtype = FROM_V2.get(datatype)
    if dtype is None:
        known = "is not one Sluice's models take" if datatype in PROTOCOL else "is not a v2 datatype"
        raise InvalidArgument(
            f"{path}.datatype {clip(datatype)!r} {known}; use one of {sorted(FROM_V2)}",
            field=f"{path}.datatype",
        )
    return dtype


def from_contents(tensor: v2.ModelInferRequest.InferInputTensor, dtype: DType, path: str) -> Array:
    shape = check_shape(tensor.shape, path)
    field = CONTENTS.get(dtype)
    if field is None:
        raise InvalidArgument(
            f"{path}: {TO_V2[dtype]} travels in raw_input_contents only", field=f"{path}.contents"
        )
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidArgument(
            f"{path}.contents.{field} holds {len(values)} values; shape {clip(list(shape))} needs {count}",
            field=f"{path}.contents.{field}",
        )
    if dtype is DType.STRING:
        return np.array([_text(v, path) for v in values], dtype=object).reshape(shape)
    return np.asarray(values, dtype=dtype.numpy).reshape(shape)


def from_raw(data: Buffer, dtype: DType, shape: tuple[int, ...], path: str, *, where: str) -> Array:
    """`where` names the bytes' field for errors (raw_input_contents[i], a shared-memory region)."""
    count = math.prod(shape)
    if dtype is DType.STRING:
        return np.array(_split_bytes(data, count, path, where), dtype=object).reshape(shape)
    kind = NUMPY[dtype]
    expected = count * kind.itemsize
    if len(data) != expected:
        raise InvalidArgument(
            f"{where} holds {len(data)} bytes for {path}; shape {clip(list(shape))} of {TO_V2[dtype]} "
            f"needs {expected}",
            field=where,
        )
    return np.frombuffer(data, dtype=kind).reshape(shape)


def _split_bytes(data: Buffer, count: int, path: str, where: str) -> list[str]:
    view = memoryview(data)
    out: list[str] = []
    at = 0
    while at < len(view) and len(out) < count:
        if at + 4 > len(view):
            break
        (size,) = _LENGTH.unpack_from(view, at)
        at += 4
        if at + size > len(view):
            break
        out.append(_text(bytes(view[at : at + size]), path))
        at += size
    if len(out) != count or at != len(view):
        raise InvalidArgument(
            f"{where} is not {count} length-prefixed BYTES elements for {path}", field=where
        )
    return out


def _text(value: bytes, path: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"{path} holds bytes that are not UTF-8 text", field=f"{path}.contents"
        ) from None


NUMPY: dict[DType, np.dtype[np.generic]] = {d: d.numpy for d in TO_V2 if d is not DType.STRING}
#: A numpy array's dtype -> its domain type (native byte order is little endian on every supported host).
BY_NUMPY: dict[np.dtype[np.generic], DType] = {d.numpy: d for d in TO_V2 if d is not DType.STRING}
BY_NUMPY.update({d.numpy.newbyteorder("="): d for d in TO_V2 if d is not DType.STRING})


def domain_dtype(array: Array) -> DType:
    if array.dtype == object:
        return DType.STRING
    found = BY_NUMPY.get(array.dtype)
    if found is None:  # big endian, or a type no model answers with
        found = BY_NUMPY[array.dtype.newbyteorder("<")]
    return found


def to_raw(array: Array) -> tuple[str, bytes]:
    """An output as (datatype, raw bytes), in one copy."""
    dtype = domain_dtype(array)
    if dtype is DType.STRING:
        parts = [str(v).encode() for v in array.reshape(-1)]
        return "BYTES", b"".join(_LENGTH.pack(len(p)) + p for p in parts)
    return TO_V2[dtype], np.ascontiguousarray(array, dtype=NUMPY[dtype]).tobytes()
