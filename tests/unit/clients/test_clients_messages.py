"""clients.messages: request building (field presence, prompts) and response -> dataclass decoding."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf import duration_pb2
from sluice.inference.v1 import inference_pb2 as pb

from clients.messages import (
    build_generate_request,
    build_infer_request,
    chunk_from_response,
    model_info_from_proto,
    result_from_response,
)
from clients.types import StreamError, TensorSpec


def _generate(prompt: object, **options: object) -> pb.GenerateRequest:
    defaults: dict[str, object] = dict.fromkeys(
        ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "priority", "request_id")
    )
    return build_generate_request("m", prompt, **{**defaults, **options})  # type: ignore[arg-type]


def test_unset_sampling_options_stay_unset() -> None:
    sampling = _generate("hi").sampling
    for field in ("max_tokens", "temperature", "top_p", "top_k", "seed"):
        assert not sampling.HasField(field), field


def test_zero_valued_options_are_still_sent() -> None:
    sampling = _generate("hi", temperature=0.0, top_k=0, seed=0, max_tokens=1).sampling
    assert all(sampling.HasField(f) for f in ("temperature", "top_k", "seed", "max_tokens"))


def test_prompt_kinds() -> None:
    assert _generate("hello").WhichOneof("prompt") == "text"
    by_ids = _generate([1, 2, 3])
    assert by_ids.WhichOneof("prompt") == "token_ids"
    assert list(by_ids.token_ids.ids) == [1, 2, 3]
    with pytest.raises(TypeError, match="prompt"):
        _generate([1.5])


def test_single_stop_string_is_not_split_into_characters() -> None:
    assert list(_generate("x", stop="END").sampling.stop) == ["END"]


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_outside_uint64_is_rejected(seed: int) -> None:
    with pytest.raises(ValueError, match="seed"):
        _generate("x", seed=seed)


def test_infer_request_fields() -> None:
    request = build_infer_request(
        "m", {"a": np.zeros(2, np.int32)}, priority="normal", request_id=None, parameters=None
    )
    assert [t.name for t in request.inputs] == ["a"]
    assert (request.priority, request.request_id, dict(request.parameters)) == (pb.PRIORITY_NORMAL, "", {})


def test_result_from_response_reads_timings() -> None:
    response = pb.InferResponse(
        model="m",
        model_version="3",
        request_id="r",
        timings=pb.Timings(
            queue_wait=duration_pb2.Duration(nanos=5_000_000),
            compute=duration_pb2.Duration(seconds=2),
            batch_size=4,
        ),
    )
    result = result_from_response(response)
    assert (result.queue_wait_s, result.compute_s, result.batch_size, result.outputs) == (0.005, 2.0, 4, {})


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
def test_finish_reasons(reason: int, name: str | None) -> None:
    chunk = chunk_from_response(pb.GenerateResponse(text="t", finish_reason=reason))  # type: ignore[arg-type]
    assert chunk.finish_reason == name
    assert chunk.usage is None
    assert chunk.error is None


def test_stream_error_code_becomes_a_status_code() -> None:
    response = pb.GenerateResponse(
        finish_reason=pb.FINISH_REASON_CANCELLED,
        error=pb.ErrorStatus(code=14, message="draining", reason="SERVER_DRAINING"),
    )
    assert chunk_from_response(response).error == StreamError(
        code=grpc.StatusCode.UNAVAILABLE, message="draining", reason="SERVER_DRAINING"
    )


def test_model_info_flattens_limits() -> None:
    info = model_info_from_proto(
        pb.ModelInfo(
            name="m",
            version="1",
            kind=pb.MODEL_KIND_TENSOR,
            outputs=[pb.TensorSpec(name="y", dtype=pb.DATA_TYPE_STRING, shape=[-1])],
            limits=pb.ModelLimits(max_batch_size=16),
        )
    )
    assert (info.kind, info.max_batch_size, info.context_length) == ("tensor", 16, 0)
    assert info.outputs == [TensorSpec(name="y", dtype="string", shape=(-1,))]
    assert model_info_from_proto(pb.ModelInfo(name="u")).kind == "unspecified"
