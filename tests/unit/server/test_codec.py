"""Codec: raw tensors decode without a copy; malformed tensors name their field; bad UTF-8 is located."""

from __future__ import annotations

import random

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from sluice.inference.v1 import inference_pb2 as pb

from server.codec import messages
from server.codec.messages import decode_generate, encode_chunk, encode_infer
from server.codec.tensors import decode_tensor, encode_tensor
from server.codec.wire import find_invalid_utf8, last_string_field
from server.domain import FinishReason, InferResult, StreamError, TokenChunk, Usage
from server.errors import InvalidArgument


def test_raw_contents_decode_as_a_view_of_the_message_bytes() -> None:
    x = np.arange(6, dtype=np.float32)
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[2, 3], raw_contents=x.tobytes())
    array = decode_tensor(tensor, "inputs[0]")
    assert array.shape == (2, 3) and not array.flags.owndata and not array.flags.writeable
    np.testing.assert_array_equal(array.reshape(-1), x)


@pytest.mark.parametrize(
    ("tensor", "field"),
    [
        (pb.Tensor(dtype=pb.DATA_TYPE_UNSPECIFIED, shape=[1], raw_contents=b"\0" * 4), "inputs[0].dtype"),
        (pb.Tensor(dtype=pb.DATA_TYPE_FLOAT32, shape=[2], raw_contents=b"\0" * 4), "inputs[0].raw_contents"),
        (pb.Tensor(dtype=pb.DATA_TYPE_FLOAT32, shape=[0]), "inputs[0].shape"),
        (pb.Tensor(dtype=pb.DATA_TYPE_FLOAT32, shape=[-1]), "inputs[0].shape"),
        (
            pb.Tensor(dtype=pb.DATA_TYPE_INT64, shape=[3], contents=pb.TensorContents(int64_contents=[1])),
            "inputs[0].contents.int64_contents",
        ),
        (pb.Tensor(dtype=pb.DATA_TYPE_STRING, shape=[1], raw_contents=b"ab"), "inputs[0].raw_contents"),
    ],
)
def test_malformed_tensors_name_the_field(tensor: pb.Tensor, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_tensor(tensor, "inputs[0]")
    assert info.value.field == field


def test_typed_and_string_contents_round_trip() -> None:
    typed = pb.Tensor(dtype=pb.DATA_TYPE_INT32, shape=[2], contents=pb.TensorContents(int32_contents=[4, 5]))
    assert decode_tensor(typed, "t").tolist() == [4, 5]
    text = pb.Tensor(
        dtype=pb.DATA_TYPE_STRING, shape=[2], contents=pb.TensorContents(string_contents=["a", "é"])
    )
    assert decode_tensor(text, "t").tolist() == ["a", "é"]
    out = encode_tensor("y", np.array([1.5, 2.5], dtype=np.float32), typed=True)
    assert list(out.contents.fp32_contents) == [1.5, 2.5] and not out.raw_contents
    raw = encode_tensor("y", np.array([1.5, 2.5], dtype=np.float32), typed=False)
    assert np.frombuffer(raw.raw_contents, np.float32).tolist() == [1.5, 2.5]


def test_invalid_utf8_is_located_by_field_path() -> None:
    request = pb.GenerateRequest(model="m", text="ok")
    request.sampling.stop.extend(["a", "b"])
    raw = request.SerializeToString().replace(b"\x01b", b"\x01\xff")
    assert find_invalid_utf8(pb.GenerateRequest.DESCRIPTOR, raw) == "sampling.stop[1]"
    assert find_invalid_utf8(pb.GenerateRequest.DESCRIPTOR, b"\x0a\x01m\x12\x02\xff\xfe") == "text"
    assert find_invalid_utf8(pb.GenerateRequest.DESCRIPTOR, request.SerializeToString()) is None


def test_generate_defaults_stay_unset_for_the_model_to_fill() -> None:
    spec = decode_generate(pb.GenerateRequest(model="m", text="hi"))
    s = spec.sampling
    assert (s.max_tokens, s.temperature, s.seed, s.stop) == (None, None, None, ())


def test_a_generates_plain_fields_decode_by_name() -> None:
    """A GenerateSpec field the request holds alike as a plain value (a per-request extra it carries) needs
    no decoding line: model and request_id come by name; fields with a shape of their own do not."""
    spec = decode_generate(
        pb.GenerateRequest(model="m", text="hi", request_id="r-1", priority=pb.PRIORITY_HIGH)
    )
    assert (spec.model, spec.request_id, spec.priority.name) == ("m", "r-1", "HIGH")
    assert {"model", "request_id"} <= set(messages._ALIKE)
    assert not {"priority", "sampling", "tools", "parallel_tool_calls"} & set(messages._ALIKE)


def test_final_chunk_carries_reason_usage_and_error() -> None:
    chunk = TokenChunk(
        text="x",
        token_ids=[120],
        finish_reason=FinishReason.CANCELLED,
        usage=Usage(3, 4),
        error=StreamError("CANCELLED", "consumer stalled", "STALLED_CONSUMER"),
    )
    msg = encode_chunk(chunk)
    assert msg.finish_reason == pb.FINISH_REASON_CANCELLED
    assert (msg.usage.prompt_tokens, msg.usage.completion_tokens, msg.usage.total_tokens) == (3, 4, 7)
    assert (msg.error.code, msg.error.reason) == (1, "STALLED_CONSUMER")


def test_an_infer_response_filled_in_place_carries_every_output_and_the_timings() -> None:
    result = InferResult(
        {
            "y": np.arange(4, dtype=np.float32).reshape(2, 2),
            "big_endian": np.array([1, 2], dtype=">i4"),
            "labels": np.array(["a", "b"], dtype=object),
        },
        "3",
        queue_wait_s=1.25,
        compute_s=0.002,
        batch_size=7,
    )
    raw = encode_infer("m", "id-1", result, typed=False)
    assert (raw.model, raw.model_version, raw.request_id) == ("m", "3", "id-1")
    assert [t.name for t in raw.outputs] == ["y", "big_endian", "labels"]
    assert list(raw.outputs[0].shape) == [2, 2] and raw.outputs[0].dtype == pb.DATA_TYPE_FLOAT32
    assert raw.outputs[0].raw_contents == np.arange(4, dtype="<f4").tobytes()
    assert raw.outputs[1].dtype == pb.DATA_TYPE_INT32
    assert raw.outputs[1].raw_contents == np.array([1, 2], dtype="<i4").tobytes()  # little-endian on the wire
    assert list(raw.outputs[2].contents.string_contents) == ["a", "b"]
    assert raw.timings.queue_wait.ToNanoseconds() == 1_250_000_000
    assert raw.timings.compute.ToNanoseconds() == 2_000_000 and raw.timings.batch_size == 7
    typed = encode_infer("m", "", result, typed=True)
    assert list(typed.outputs[0].contents.fp32_contents) == [0.0, 1.0, 2.0, 3.0]
    assert not typed.outputs[0].raw_contents
    assert decode_tensor(raw.outputs[0], "outputs[0]").tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_the_model_name_read_from_raw_bytes_is_what_protobuf_reads() -> None:
    # last_string_field is protobuf's field walk written out for speed (it runs on every guarded call):
    # wherever protobuf parses a request, it reads the same model (the last occurrence winning), on whole,
    # truncated, repeated and byte-flipped requests, seeded.
    whole = pb.InferRequest(
        model="mlp", request_id="r1", inputs=[encode_tensor("x", np.ones(4, np.float32), typed=False)]
    )
    data = whole.SerializeToString()
    number = pb.InferRequest.DESCRIPTOR.fields_by_name["model"].number
    rng, parsed = random.Random(7), 0
    cases = [data, data + pb.InferRequest(model="other").SerializeToString(), b""]
    for _ in range(3000):
        raw = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        cases.append(bytes(raw[: rng.randint(0, len(raw))] if rng.random() < 0.3 else raw))
    for raw in cases:
        message = pb.InferRequest()
        try:
            message.ParseFromString(raw)
        except DecodeError:
            continue
        parsed += 1
        assert last_string_field(raw, number) == message.model, raw
    assert parsed > 500  # most cases still parse: the comparison ran, not only the skips
    assert last_string_field(data + pb.InferRequest(model="other").SerializeToString(), number) == "other"
