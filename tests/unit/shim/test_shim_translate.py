"""translate.py: JSON tensors and sampling to protobuf, outputs back to JSON, proto paths to JSON names."""

from __future__ import annotations

import base64
import math

import numpy as np
import orjson
import pytest
from shim_fakes import MODEL_INFO
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import decode_raw_contents
from clients.messages import build_generate_request, infer_request
from shim import jsonio
from shim.errors import ShimError
from shim.native import translate
from shim.native.request_models import GenerateBody, InferBody, TensorIn


def _tensor(dtype: str, data: list[object], shape: list[int] | None = None) -> TensorIn:
    return TensorIn.model_validate({"name": "x", "dtype": dtype, "shape": shape or [len(data)], "data": data})


@pytest.mark.parametrize(
    ("dtype", "data"),
    [
        ("FLOAT32", [1, 2.5]),
        ("FLOAT16", [0.5, -1]),
        ("FLOAT64", [1e300, 2]),
        ("INT32", [1, -(2**31)]),
        ("INT64", [2**62, -1]),
        ("BOOL", [True, False]),
    ],
)
def test_each_numeric_dtype_goes_as_little_endian_raw_bytes(dtype: str, data: list[object]) -> None:
    message = translate.tensor_to_proto(_tensor(dtype, data), 0)
    assert message.dtype == translate.DTYPE_BY_NAME[dtype]
    assert list(message.shape) == [2]
    assert decode_raw_contents(message).tolist() == data
    assert not message.HasField("contents")


def test_strings_go_as_string_contents() -> None:
    message = translate.tensor_to_proto(_tensor("STRING", ["a", "é"]), 0)
    assert list(message.contents.string_contents) == ["a", "é"] and message.raw_contents == b""


def test_a_float_past_float32_range_is_infinity_there() -> None:
    message = translate.tensor_to_proto(_tensor("FLOAT32", [1e300, -1e300]), 0)
    assert decode_raw_contents(message).tolist() == [math.inf, -math.inf]


@pytest.mark.parametrize(
    ("dtype", "value"), [("INT32", 2**31), ("INT64", -(2**63) - 1), ("FLOAT64", 10**400)]
)
def test_integers_out_of_range_are_refused(dtype: str, value: int) -> None:
    with pytest.raises(ShimError) as caught:
        translate.tensor_to_proto(_tensor(dtype, [value, 0]), 0)
    assert caught.value.body.reason == "INVALID_TENSOR_DATA"
    assert "out of range" in caught.value.body.message


@pytest.mark.parametrize(
    ("dtype", "data"),
    [("FLOAT32", [True]), ("INT32", [1.5]), ("INT64", ["1"]), ("BOOL", [1]), ("STRING", [1])],
)
def test_elements_of_the_wrong_kind_are_refused(dtype: str, data: list[object]) -> None:
    with pytest.raises(ShimError) as caught:
        translate.tensor_to_proto(_tensor(dtype, data), 3)
    assert caught.value.status == 400
    assert caught.value.body.field_violations[0].field == "inputs[3].data"


def test_int32_out_of_range_is_refused() -> None:
    with pytest.raises(ShimError) as caught:
        translate.tensor_to_proto(_tensor("INT32", [2**31]), 0)
    assert caught.value.body.reason == "INVALID_TENSOR_DATA"


def test_element_count_must_match_shape() -> None:
    with pytest.raises(ShimError) as caught:
        translate.tensor_to_proto(_tensor("FLOAT32", [1, 2, 3], shape=[2, 2]), 1)
    assert caught.value.body.reason == "SHAPE_MISMATCH"
    assert caught.value.body.field_violations[0].field == "inputs[1].data"


def test_data_b64_goes_to_raw_contents() -> None:
    raw = np.arange(6, dtype="<i8").tobytes()
    tensor = TensorIn.model_validate(
        {"name": "ids", "dtype": "INT64", "shape": [2, 3], "data_b64": base64.b64encode(raw).decode()}
    )
    message = translate.tensor_to_proto(tensor, 0)
    assert message.raw_contents == raw
    assert not message.contents.int64_contents


def test_data_b64_must_match_the_byte_count() -> None:
    tensor = TensorIn.model_validate(
        {"name": "x", "dtype": "FLOAT32", "shape": [3], "data_b64": base64.b64encode(b"\0" * 8).decode()}
    )
    with pytest.raises(ShimError) as caught:
        translate.tensor_to_proto(tensor, 0)
    assert caught.value.body.field_violations[0].field == "inputs[0].data_b64"


def test_infer_request_carries_parameters_priority_and_asks_for_raw_outputs() -> None:
    body = InferBody.model_validate(
        {
            "model": "m",
            "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [1.0]}],
            "parameters": {"flag": True, "n": 3, "scale": 0.5, "mode": "fast"},
            "request_id": "r-1",
        }
    )
    message = translate.infer_request_to_proto(body, priority="high")
    assert message.typed_outputs is False
    assert message.priority == pb.PRIORITY_HIGH
    assert message.request_id == "r-1"
    assert message.parameters["flag"].WhichOneof("kind") == "bool_value"
    assert message.parameters["n"].int64_value == 3
    assert message.parameters["scale"].double_value == 0.5
    assert message.parameters["mode"].string_value == "fast"


@pytest.mark.parametrize(
    ("dtype", "numpy_dtype", "values"),
    [
        (pb.DATA_TYPE_FLOAT32, "<f4", [0.5, -2.0]),
        (pb.DATA_TYPE_FLOAT16, "<f2", [0.5, 65504.0]),
        (pb.DATA_TYPE_FLOAT64, "<f8", [1e300, 0.1]),
        (pb.DATA_TYPE_INT32, "<i4", [-5, 7]),
        (pb.DATA_TYPE_INT64, "<i8", [2**40, -1]),
        (pb.DATA_TYPE_BOOL, "?", [True, False]),
    ],
)
def test_raw_outputs_decode_little_endian(
    dtype: pb.DataType.ValueType, numpy_dtype: str, values: list[object]
) -> None:
    tensor = pb.Tensor(
        name="y", dtype=dtype, shape=[2], raw_contents=np.asarray(values, dtype=numpy_dtype).tobytes()
    )
    decoded = translate.tensor_to_json(tensor)
    written = orjson.loads(jsonio.dumps(decoded))
    assert written == {"name": "y", "dtype": translate.NAME_BY_DTYPE[dtype], "shape": [2], "data": values}


def test_typed_outputs_are_read_when_raw_is_empty() -> None:
    strings = pb.Tensor(
        name="s", dtype=pb.DATA_TYPE_STRING, shape=[2], contents=pb.TensorContents(string_contents=["a", "b"])
    )
    assert translate.tensor_to_json(strings)["data"] == ["a", "b"]
    ints = pb.Tensor(
        name="i", dtype=pb.DATA_TYPE_INT64, shape=[1], contents=pb.TensorContents(int64_contents=[9])
    )
    assert translate.tensor_to_json(ints)["data"] == [9]


@pytest.mark.parametrize(
    ("proto_path", "json_name"),
    [
        ("sampling.max_tokens", "max_tokens"),
        ("sampling.temperature", "temperature"),
        ("inputs[0].shape", "inputs[0].shape"),
        ("inputs[2].raw_contents", "inputs[2].data_b64"),
        ("inputs[1].contents.fp32_contents", "inputs[1].data"),
        ("text", "prompt"),
        ("token_ids.ids", "prompt_token_ids"),
        ("model", "model"),
    ],
)
def test_proto_paths_become_json_names(proto_path: str, json_name: str) -> None:
    assert translate.json_field_for(proto_path) == json_name


def test_generate_request_sets_only_the_sampling_fields_given() -> None:
    body = GenerateBody.model_validate({"model": "g", "prompt": "hi", "temperature": 0.0, "stop": "\n"})
    message = translate.generate_request_to_proto(body, priority="low")
    assert message.WhichOneof("prompt") == "text"
    assert message.sampling.HasField("temperature")
    assert message.sampling.temperature == 0.0
    assert not message.sampling.HasField("max_tokens")
    assert not message.sampling.HasField("seed")
    assert list(message.sampling.stop) == ["\n"]
    assert message.priority == pb.PRIORITY_LOW


def test_generate_request_with_token_ids_and_all_sampling() -> None:
    body = GenerateBody.model_validate(
        {
            "model": "g",
            "prompt_token_ids": [5, 6],
            "max_tokens": 4,
            "top_p": 0.5,
            "top_k": 2,
            "seed": 2**63,
            "stop": ["a", "b"],
        }
    )
    message = translate.generate_request_to_proto(body, priority=None)
    assert list(message.token_ids.ids) == [5, 6]
    assert message.sampling.max_tokens == 4
    assert math.isclose(message.sampling.top_p, 0.5)
    assert message.sampling.top_k == 2
    assert message.sampling.seed == 2**63
    assert list(message.sampling.stop) == ["a", "b"]
    assert message.priority == pb.PRIORITY_UNSPECIFIED


def test_model_info_json_keeps_proto_names_and_zero_values() -> None:
    info = translate.model_info_to_json(MODEL_INFO)
    assert info["name"] == "echo"
    assert info["kind"] == "MODEL_KIND_TENSOR"
    assert info["inputs"][0]["dtype"] == "DATA_TYPE_FLOAT32"
    assert info["limits"]["max_batch_size"] == 8
    assert info["limits"]["context_length"] == 0


def test_requests_are_the_ones_the_client_library_builds() -> None:
    body = GenerateBody.model_validate(
        {"model": "g", "prompt": "hi", "max_tokens": 3, "stop": ["a"], "seed": 9, "request_id": "r"}
    )
    assert translate.generate_request_to_proto(body, priority="high") == build_generate_request(
        "g",
        "hi",
        max_tokens=3,
        temperature=None,
        top_p=None,
        top_k=None,
        seed=9,
        stop=["a"],
        priority="high",
        request_id="r",
    )
    infer = InferBody.model_validate(
        {
            "model": "m",
            "inputs": [{"name": "x", "dtype": "INT32", "shape": [1], "data": [4]}],
            "parameters": {"k": 1},
        }
    )
    sent = translate.infer_request_to_proto(infer, priority=None)
    assert sent == infer_request(
        "m",
        [translate.tensor_to_proto(infer.inputs[0], 0)],
        priority=None,
        request_id=None,
        parameters={"k": 1},
    )
    assert sent.typed_outputs is False
