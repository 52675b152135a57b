"""The v2 codec (server/kserve/): every datatype Sluice's models take, from `contents` and from raw bytes,
a batch split into rows, and errors that name the input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from sluice.kserve.v2 import grpc_service_pb2 as v2

from server.domain import DType, InferResult, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.errors import InvalidArgument
from server.kserve.calls import V2Call
from server.kserve.requests import decode_infer, decode_inputs
from server.kserve.responses import encode_infer
from server.kserve.tensors import to_raw

CASES = {
    "BOOL": (np.array([[True, False, True]]), "bool_contents"),
    "INT32": (np.array([[1, -2, 3]], dtype=np.int32), "int_contents"),
    "INT64": (np.array([[2**40, -1, 0]], dtype=np.int64), "int64_contents"),
    "FP32": (np.array([[0.5, -1.25, 3.0]], dtype=np.float32), "fp32_contents"),
    "FP64": (np.array([[0.1, 1e300, -2.5]], dtype=np.float64), "fp64_contents"),
    "FP16": (np.array([[0.5, -1.0, 2.0]], dtype=np.float16), None),
    "BYTES": (np.array([["a", "é", ""]], dtype=object), "bytes_contents"),
}


def request(name: str = "x", datatype: str = "FP32", shape: tuple[int, ...] = (1, 3)) -> v2.ModelInferRequest:
    message = v2.ModelInferRequest(model_name="m")
    message.inputs.add(name=name, datatype=datatype, shape=shape)
    return message


@pytest.mark.parametrize("datatype", list(CASES))
def test_each_datatype_from_raw_bytes_and_from_contents(datatype: str) -> None:
    array, field = CASES[datatype]
    raw = request(datatype=datatype)
    raw.raw_input_contents.append(to_raw(array)[1])
    np.testing.assert_array_equal(decode_inputs(raw, None)["x"], array)
    typed = request(datatype=datatype)
    if field is None:  # FP16 has no contents field, as in Triton
        typed.inputs[0].contents.fp32_contents.extend(array.reshape(-1).tolist())
        with pytest.raises(InvalidArgument, match="raw_input_contents only"):
            decode_inputs(typed, None)
        return
    values = [v.encode() for v in array.reshape(-1)] if datatype == "BYTES" else array.reshape(-1).tolist()
    getattr(typed.inputs[0].contents, field).extend(values)
    np.testing.assert_array_equal(decode_inputs(typed, None)["x"], array)


def test_bytes_travel_length_prefixed() -> None:
    assert to_raw(np.array(["ab"], dtype=object)) == ("BYTES", struct.pack("<I", 2) + b"ab")
    bad = request(datatype="BYTES", shape=(1, 1))
    bad.raw_input_contents.append(struct.pack("<I", 9) + b"ab")
    with pytest.raises(InvalidArgument, match="length-prefixed"):
        decode_inputs(bad, None)


@pytest.mark.parametrize(
    ("datatype", "message"),
    [("UINT8", "is not one Sluice's models take"), ("FLOAT", "is not a v2 datatype")],
)
def test_datatypes_sluice_does_not_take_are_named(datatype: str, message: str) -> None:
    bad = request(datatype=datatype)
    bad.raw_input_contents.append(b"\0" * 3)
    with pytest.raises(InvalidArgument, match=message) as info:
        decode_inputs(bad, None)
    assert "inputs[0].datatype" in str(info.value)


MODEL = ModelDescriptor(
    "m", "1", ModelKind.TENSOR, "", ModelLimits(max_batch_size=4), "cpu",
    inputs=(TensorSpec("x", DType.FLOAT32, (3,)),), outputs=(TensorSpec("y", DType.FLOAT32, (3,)),),
)  # fmt: skip


def test_a_batch_becomes_rows_and_their_results_one_response() -> None:
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    message = request(shape=(2, 3))
    message.raw_input_contents.append(rows.tobytes())
    message.id = "b-1"
    batch = decode_infer(V2Call(message), MODEL, None)
    assert [item.inputs["x"].tolist() for item in batch.items] == rows.tolist()
    results = [InferResult({"y": item.inputs["x"] * 2}, "1", 0.0, 0.0, 2) for item in batch.items]
    answer = encode_infer("m", "b-1", results, None)
    assert (answer.id, list(answer.outputs[0].shape)) == ("b-1", [2, 3])
    np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(2, 3), rows * 2)


def _infer(
    *,
    name: str = "x",
    datatype: str = "FP32",
    shape: tuple[int, ...] = (1, 3),
    raw: bytes | None = None,
    extra_raw: bool = False,
    output: str = "",
    region: str = "",
) -> v2.ModelInferRequest:
    message = request(name, datatype, shape)
    message.raw_input_contents.append(raw if raw is not None else np.zeros(shape, np.float32).tobytes())
    if extra_raw:
        message.raw_input_contents.append(b"x")
    if output:
        message.outputs.add(name=output)
    if region:
        message.inputs[0].parameters["shared_memory_region"].string_param = region
    return message  # fmt: skip


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (_infer(name="z"), "unknown input 'z'"),
        (_infer(datatype="INT32", raw=np.zeros(3, np.int32).tobytes()), "must be FP32, got INT32"),
        (_infer(shape=(1, 2)), "must have shape [-1, 3]"),
        (_infer(shape=(5, 3)), "max_batch_size is 4"),
        (_infer(extra_raw=True), "raw_input_contents holds 2 entries"),
        (_infer(output="nope"), "unknown output 'nope'"),
        (_infer(region="r"), "shared memory is not served here"),
    ],
)
def test_errors_name_the_input(message: v2.ModelInferRequest, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_infer(V2Call(message), MODEL, None)
    assert needle in str(info.value)
