"""SluiceClient over the wire against the scripted in-process server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2 as pb

from clients import (
    DeadlineExceededError,
    GenerationChunk,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SluiceClient,
    StreamError,
    UnavailableError,
    Usage,
)

if TYPE_CHECKING:  # the fixture's type only; tests never import conftest at run time
    from tests.unit.clients.conftest import FakeServer


@pytest.fixture
def client(fake_server: FakeServer) -> Iterator[SluiceClient]:
    with SluiceClient(fake_server.target, timeout=10.0) as client:
        yield client


def test_infer_round_trips_tensors_and_metadata(client: SluiceClient, fake_server: FakeServer) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer(
        "double",
        {"x": x, "labels": ["a", "b"]},
        priority="high",
        request_id="req-1",
        parameters={"scale": 2.5, "verbose": True},
    )
    np.testing.assert_array_equal(result.outputs["x"], x * 2)
    assert result.outputs["x"].dtype == np.float32  # type: ignore[union-attr]
    assert result.outputs["labels"] == ["A", "B"]
    assert (result.model, result.model_version, result.request_id) == ("double", "7", "req-1")
    assert (result.queue_wait_s, result.compute_s, result.batch_size) == (0.25, 1.5, 3)
    sent = fake_server.service.infer_requests[-1]
    assert sent.priority == pb.PRIORITY_HIGH
    assert sent.parameters["scale"].double_value == 2.5
    assert sent.parameters["verbose"].WhichOneof("kind") == "bool_value"


def test_infer_decodes_typed_outputs(client: SluiceClient) -> None:
    x = np.array([[1, 2], [3, 4]], dtype=np.int64)
    result = client.infer("typed", {"x": x})
    np.testing.assert_array_equal(result.outputs["x"], x * 2)
    assert result.outputs["x"].dtype == np.int64  # type: ignore[union-attr]


def test_unknown_model_raises_not_found_with_error_info(client: SluiceClient) -> None:
    with pytest.raises(NotFoundError) as caught:
        client.infer("nope", {"x": np.zeros(1, np.float32)})
    error = caught.value
    assert error.code is grpc.StatusCode.NOT_FOUND
    assert (error.reason, error.domain, error.metadata) == (
        "MODEL_NOT_FOUND",
        "sluice.test",
        {"model": "nope"},
    )
    assert isinstance(error.__cause__, grpc.RpcError)


def test_overload_carries_retry_after(client: SluiceClient) -> None:
    with pytest.raises(ResourceExhaustedError) as caught:
        client.infer("overloaded", {"x": np.zeros(1, np.float32)})
    assert caught.value.retry_after == 1.5
    assert caught.value.metadata == {"model": "overloaded", "queue_depth": "64"}


def test_bad_request_carries_field_violations(client: SluiceClient) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        client.infer("strict", {"x": np.zeros(1, np.float32)})
    assert caught.value.field_violations == [("inputs[0].shape", "must be [512]")]
    assert caught.value.reason == "SHAPE_MISMATCH"


def test_infer_is_retried_on_unavailable(client: SluiceClient, fake_server: FakeServer) -> None:
    result = client.infer("flaky", {"x": np.ones(2, np.float32)})
    np.testing.assert_array_equal(result.outputs["x"], [2.0, 2.0])
    assert fake_server.service.infer_attempts["flaky"] == 3


def test_generate_is_never_retried(client: SluiceClient, fake_server: FakeServer) -> None:
    with pytest.raises(UnavailableError) as caught:
        list(client.generate("unavailable", "hello"))
    assert caught.value.reason == "DRAINING"
    assert fake_server.service.generate_attempts["unavailable"] == 1


def test_generate_streams_chunks_then_finish(client: SluiceClient, fake_server: FakeServer) -> None:
    with client.generate("echo", "the quick brown fox", max_tokens=3, seed=42, stop=["\n"]) as stream:
        chunks = list(stream)
    assert [c.text for c in chunks[:-1]] == ["the ", "quick ", "brown "]
    assert [c.token_ids for c in chunks[:-1]] == [[0], [1], [2]]
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage == Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7)
    sampling = fake_server.service.generate_requests[-1].sampling
    assert (sampling.max_tokens, sampling.seed, list(sampling.stop)) == (3, 42, ["\n"])
    assert not sampling.HasField("temperature")


def test_generate_accepts_token_ids(client: SluiceClient) -> None:
    chunks = list(client.generate("echo", [5, 6]))
    assert "".join(c.text for c in chunks) == "<5> <6> "
    assert chunks[-1].finish_reason == "stop"


def test_generate_reports_in_band_error(client: SluiceClient) -> None:
    chunks = list(client.generate("failing", "x"))
    assert chunks[-1] == GenerationChunk(
        text="",
        token_ids=[],
        finish_reason="error",
        usage=Usage(1, 1, 2),
        error=StreamError(code=grpc.StatusCode.INTERNAL, message="decoder failed", reason="DECODE_FAILED"),
    )


def test_cancel_stops_iteration_and_reaches_server(client: SluiceClient, fake_server: FakeServer) -> None:
    stream = client.generate("endless", "x")
    assert next(stream).text == "tick"
    stream.cancel()
    assert list(stream) == []
    assert fake_server.service.stream_cancelled.wait(timeout=10)


def test_leaving_the_context_cancels_the_call(client: SluiceClient, fake_server: FakeServer) -> None:
    with client.generate("endless", "x") as stream:
        assert next(stream).text == "tick"
    assert fake_server.service.stream_cancelled.wait(timeout=10)


def test_deadline_raises_deadline_exceeded(client: SluiceClient) -> None:
    with pytest.raises(DeadlineExceededError):
        list(client.generate("endless", "x", timeout=0.2))


def test_list_and_get_models(client: SluiceClient) -> None:
    models = client.list_models()
    assert [m.name for m in models] == ["double", "echo"]
    echo = client.get_model("echo")
    assert echo.kind == "generative"
    assert (echo.context_length, echo.max_tokens, echo.max_concurrent_sequences) == (2048, 256, 16)
    assert echo.device == "cuda:0"
    double = models[0]
    assert double.kind == "tensor"
    assert double.inputs[0].dtype == "float32"
    assert double.inputs[0].shape == (-1, 4)
    with pytest.raises(NotFoundError):
        client.get_model("missing")


def test_client_rejects_non_positive_timeout(fake_server: FakeServer) -> None:
    with pytest.raises(ValueError, match="timeout"):
        SluiceClient(fake_server.target, timeout=0)
