"""clients.codec: numpy <-> Tensor round trips, wire byte order, zero-copy decoding, priority, parameters."""

from __future__ import annotations

import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import (
    decode_tensor,
    encode_parameters,
    encode_priority,
    encode_tensor,
    finish_reason_name,
)

NUMERIC = [
    (np.float32, pb.DATA_TYPE_FLOAT32),
    (np.float64, pb.DATA_TYPE_FLOAT64),
    (np.float16, pb.DATA_TYPE_FLOAT16),
    (np.int32, pb.DATA_TYPE_INT32),
    (np.int64, pb.DATA_TYPE_INT64),
    (np.bool_, pb.DATA_TYPE_BOOL),
]
SHAPES = [(), (0,), (5,), (2, 3), (2, 1, 4)]


def _sample(dtype: type[np.generic], shape: tuple[int, ...]) -> np.ndarray:
    values = np.arange(int(np.prod(shape)), dtype=np.int64) - 3
    return (values % 2 == 0 if dtype is np.bool_ else values.astype(dtype)).reshape(shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("dtype", "data_type"), NUMERIC)
def test_numeric_round_trip(dtype: type[np.generic], data_type: int, shape: tuple[int, ...]) -> None:
    array = _sample(dtype, shape)
    tensor = encode_tensor("x", array)
    assert (tensor.name, tensor.dtype, tuple(tensor.shape)) == ("x", data_type, shape)
    assert tensor.raw_contents == array.astype(array.dtype.newbyteorder("<")).tobytes()
    assert not tensor.HasField("contents")
    decoded = decode_tensor(pb.Tensor.FromString(tensor.SerializeToString()))
    assert isinstance(decoded, np.ndarray)
    assert decoded.dtype == array.dtype
    assert decoded.shape == shape
    np.testing.assert_array_equal(decoded, array)


def test_raw_bytes_are_little_endian_whatever_the_input_order() -> None:
    big = np.array([1, 256], dtype=">i4")
    tensor = encode_tensor("x", big)
    assert tensor.raw_contents == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    np.testing.assert_array_equal(decode_tensor(tensor), [1, 256])


def test_non_contiguous_input_is_sent_in_row_major_order() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3).T
    decoded = decode_tensor(encode_tensor("x", array))
    np.testing.assert_array_equal(decoded, array)


def test_raw_decode_is_a_read_only_view_not_a_copy() -> None:
    tensor = encode_tensor("x", np.arange(4, dtype=np.float32))
    decoded = decode_tensor(tensor)
    assert isinstance(decoded, np.ndarray)
    assert not decoded.flags.owndata
    assert not decoded.flags.writeable
    owner: object = decoded
    while isinstance(owner, np.ndarray):  # reshape adds a view over the frombuffer view
        owner = owner.base
    assert isinstance(owner, bytes)


def test_strings_use_typed_contents() -> None:
    tensor = encode_tensor("labels", ["héllo", "wörld", ""])
    assert tensor.dtype == pb.DATA_TYPE_STRING
    assert list(tensor.shape) == [3]
    assert tensor.raw_contents == b""
    assert decode_tensor(tensor) == ["héllo", "wörld", ""]


def test_string_array_keeps_its_shape() -> None:
    tensor = encode_tensor("grid", np.array([["a", "b"], ["c", "d"]]))
    assert (tensor.dtype, list(tensor.shape)) == (pb.DATA_TYPE_STRING, [2, 2])
    assert decode_tensor(tensor) == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("data_type", "field", "values", "dtype"),
    [
        (pb.DATA_TYPE_FLOAT32, "fp32_contents", [0.5, -1.0, 2.0, 3.0], np.float32),
        (pb.DATA_TYPE_FLOAT16, "fp32_contents", [0.5, -1.0, 2.0, 3.0], np.float16),
        (pb.DATA_TYPE_FLOAT64, "fp64_contents", [0.1, 0.2, 0.3, 0.4], np.float64),
        (pb.DATA_TYPE_INT32, "int32_contents", [1, -2, 3, -4], np.int32),
        (pb.DATA_TYPE_INT64, "int64_contents", [2**40, -1, 0, 7], np.int64),
        (pb.DATA_TYPE_BOOL, "bool_contents", [True, False, False, True], np.bool_),
    ],
)
def test_typed_contents_decode_when_raw_is_empty(
    data_type: int, field: str, values: list[float], dtype: type[np.generic]
) -> None:
    tensor = pb.Tensor(name="y", dtype=data_type, shape=[2, 2])  # type: ignore[arg-type]
    getattr(tensor.contents, field).extend(values)
    decoded = decode_tensor(tensor)
    assert isinstance(decoded, np.ndarray)
    assert decoded.dtype == dtype
    np.testing.assert_array_equal(decoded, np.array(values, dtype=dtype).reshape(2, 2))


def test_unsupported_dtype_is_rejected_with_the_supported_list() -> None:
    with pytest.raises(ValueError, match=r"uint8 is not supported.*float32"):
        encode_tensor("x", np.zeros(3, dtype=np.uint8))


@pytest.mark.parametrize("value", [[1.0, 2.0], "text", 3])
def test_non_array_non_string_inputs_are_rejected(value: object) -> None:
    with pytest.raises(TypeError, match="input 'x'"):
        encode_tensor("x", value)  # type: ignore[arg-type]


def test_raw_bytes_that_do_not_fill_the_shape_are_rejected() -> None:
    tensor = pb.Tensor(name="z", dtype=pb.DATA_TYPE_FLOAT32, shape=[3], raw_contents=b"\x00" * 8)
    with pytest.raises(ValueError, match="8 raw bytes"):
        decode_tensor(tensor)


def test_typed_count_mismatch_is_rejected() -> None:
    tensor = pb.Tensor(name="z", dtype=pb.DATA_TYPE_INT32, shape=[3])
    tensor.contents.int32_contents.extend([1, 2])
    with pytest.raises(ValueError, match="2 elements"):
        decode_tensor(tensor)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, pb.PRIORITY_UNSPECIFIED),
        ("low", pb.PRIORITY_LOW),
        ("normal", pb.PRIORITY_NORMAL),
        ("high", pb.PRIORITY_HIGH),
    ],
)
def test_priority_mapping(name: str | None, expected: int) -> None:
    assert encode_priority(name) == expected  # type: ignore[arg-type]


def test_unknown_priority_is_rejected() -> None:
    with pytest.raises(ValueError, match="'urgent'"):
        encode_priority("urgent")  # type: ignore[arg-type]


def test_parameters_pick_the_oneof_by_type() -> None:
    encoded = encode_parameters({"flag": True, "n": 3, "scale": 0.5, "mode": "fast"})
    assert {key: value.WhichOneof("kind") for key, value in encoded.items()} == {
        "flag": "bool_value",
        "n": "int64_value",
        "scale": "double_value",
        "mode": "string_value",
    }
    assert encoded["n"].int64_value == 3
    with pytest.raises(TypeError, match="parameter 'bad'"):
        encode_parameters({"bad": [1]})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("reason", "name"),
    [
        (pb.FINISH_REASON_UNSPECIFIED, None),
        (pb.FINISH_REASON_LENGTH, "length"),
        (pb.FINISH_REASON_STOP, "stop"),
        (pb.FINISH_REASON_CANCELLED, "cancelled"),
        (pb.FINISH_REASON_ERROR, "error"),
    ],
)
def test_finish_reason_names(reason: pb.FinishReason.ValueType, name: str | None) -> None:
    assert finish_reason_name(reason) == name
