"""The v2 datatype names (`FP32`, `BYTES`, ...) <-> the server's DType, with each one's `contents` field
and ModelConfig's DataType enum value. The protocol names more types than Sluice's models take (UINT8,
BF16, ...): those are refused by name, never guessed."""

from __future__ import annotations

from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.domain import DType

TO_V2: dict[DType, str] = {
    DType.BOOL: "BOOL",
    DType.INT32: "INT32",
    DType.INT64: "INT64",
    DType.FLOAT16: "FP16",
    DType.FLOAT32: "FP32",
    DType.FLOAT64: "FP64",
    DType.STRING: "BYTES",
}
FROM_V2: dict[str, DType] = {name: dtype for dtype, name in TO_V2.items()}
#: Every datatype the protocol defines, for a message that tells "not supported" from "not a datatype".
PROTOCOL = frozenset((*TO_V2.values(), "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "BF16"))
#: The InferTensorContents field that carries each type; FP16 has none (raw bytes only), as in Triton.
CONTENTS: dict[DType, str] = {
    DType.BOOL: "bool_contents",
    DType.INT32: "int_contents",
    DType.INT64: "int64_contents",
    DType.FLOAT32: "fp32_contents",
    DType.FLOAT64: "fp64_contents",
    DType.STRING: "bytes_contents",
}
CONFIG_TYPE: dict[DType, v2.DataType.ValueType] = {
    DType.BOOL: v2.TYPE_BOOL,
    DType.INT32: v2.TYPE_INT32,
    DType.INT64: v2.TYPE_INT64,
    DType.FLOAT16: v2.TYPE_FP16,
    DType.FLOAT32: v2.TYPE_FP32,
    DType.FLOAT64: v2.TYPE_FP64,
    DType.STRING: v2.TYPE_STRING,
}
