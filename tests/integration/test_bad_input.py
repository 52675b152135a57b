"""Every bad input gets a clear error with the right status and the field it concerns, over gRPC and HTTP,
and leaves nothing behind: the next valid request succeeds and nothing stays in flight."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, ShimProcess, wait_until

X = np.ones(512, dtype=np.float32)


def tensor(**overrides: object) -> pb.Tensor:
    fields: dict[str, object] = {
        "name": "x",
        "dtype": pb.DATA_TYPE_FLOAT32,
        "shape": [512],
        "raw_contents": X.tobytes(),
    }
    fields.update(overrides)
    return pb.Tensor(**fields)  # type: ignore[arg-type]


def details(error: grpc.RpcError) -> tuple[str, list[str]]:
    """(ErrorInfo reason, BadRequest fields) from the status details."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "every error carries google.rpc details"
    reason, fields = "", []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields = [v.field for v in bad.field_violations]
    return reason, fields


@pytest.fixture(autouse=True)
def nothing_left_behind(server: ServerProcess, stub: pb_grpc.InferenceServiceStub) -> Iterator[None]:
    yield
    reply = stub.Infer(pb.InferRequest(model="mlp", inputs=[tensor()]), timeout=30)
    assert reply.outputs[0].shape == [512]
    tokens = list(
        stub.Generate(
            pb.GenerateRequest(
                model="byte-lm", text="ok", sampling=pb.SamplingParams(max_tokens=3, ignore_eos=True)
            ),
            timeout=30,
        )
    )
    assert tokens[-1].usage.completion_tokens == 3
    wait_until(lambda: server.metric("sluice_requests_in_flight") == 0, what="in-flight back to zero")
    wait_until(lambda: server.metric("sluice_requests_waiting") == 0, what="waiting back to zero")


INFER_CASES = {
    "unknown model": (pb.InferRequest(model="nope", inputs=[tensor()]), grpc.StatusCode.NOT_FOUND, None),
    "wrong dtype": (
        pb.InferRequest(
            model="mlp",
            inputs=[tensor(dtype=pb.DATA_TYPE_FLOAT64, raw_contents=X.astype(np.float64).tobytes())],
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].dtype",
    ),
    "wrong shape": (
        pb.InferRequest(model="mlp", inputs=[tensor(shape=[2, 256])]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].shape",
    ),
    "raw size mismatch": (
        pb.InferRequest(model="mlp", inputs=[tensor(raw_contents=X[:10].tobytes())]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].raw_contents",
    ),
    "empty input": (
        pb.InferRequest(model="mlp", inputs=[tensor(shape=[0], raw_contents=b"")]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].shape",
    ),
    "no inputs": (pb.InferRequest(model="mlp"), grpc.StatusCode.INVALID_ARGUMENT, "inputs"),
    "unset dtype": (
        pb.InferRequest(model="mlp", inputs=[tensor(dtype=pb.DATA_TYPE_UNSPECIFIED)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0].dtype",
    ),
}


@pytest.mark.parametrize("case", INFER_CASES, ids=list(INFER_CASES))
def test_bad_infer_requests(stub: pb_grpc.InferenceServiceStub, case: str) -> None:
    request, code, field = INFER_CASES[case]
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(request, timeout=30)
    assert info.value.code() == code
    reason, fields = details(info.value)
    if field is None:
        assert reason == "MODEL_NOT_FOUND"
    else:
        assert fields == [field]


def sampling(**kwargs: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(model="byte-lm", text="Hi", sampling=pb.SamplingParams(**kwargs))  # type: ignore[arg-type]


GENERATE_CASES = {
    "max_tokens zero": (sampling(max_tokens=0), "sampling.max_tokens", "INVALID_ARGUMENT"),
    "max_tokens negative": (sampling(max_tokens=-5), "sampling.max_tokens", "INVALID_ARGUMENT"),
    "max_tokens above limit": (sampling(max_tokens=10**6), "sampling.max_tokens", "LIMIT_EXCEEDED"),
    "temperature negative": (sampling(temperature=-0.5), "sampling.temperature", "INVALID_ARGUMENT"),
    "top_p zero": (sampling(top_p=0.0), "sampling.top_p", "INVALID_ARGUMENT"),
    "token id outside vocab": (
        pb.GenerateRequest(model="byte-lm", token_ids=pb.TokenIds(ids=[1, 9999])),
        "token_ids.ids[1]",
        "INVALID_ARGUMENT",
    ),
    "no prompt": (pb.GenerateRequest(model="byte-lm"), "text", "INVALID_ARGUMENT"),
}


@pytest.mark.parametrize("case", GENERATE_CASES, ids=list(GENERATE_CASES))
def test_bad_generate_requests(stub: pb_grpc.InferenceServiceStub, case: str) -> None:
    request, field, reason = GENERATE_CASES[case]
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(request, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(info.value) == (reason, [field])


def test_non_utf8_text_names_the_field(channel: grpc.Channel) -> None:
    # protobuf will not serialize invalid UTF-8 into a string field, so the bytes are written by hand:
    # field 1 (model) = "byte-lm", field 2 (text) = b"\xff\xfe".
    raw = b"\x0a\x07byte-lm" + b"\x12\x02\xff\xfe"
    call = channel.unary_stream("/sluice.inference.v1.InferenceService/Generate")
    with pytest.raises(grpc.RpcError) as info:
        list(call(raw, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(info.value) == ("INVALID_ARGUMENT", ["text"])


def test_unknown_model_for_generate(stub: pb_grpc.InferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(pb.GenerateRequest(model="nope", text="x"), timeout=30))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert details(info.value)[0] == "MODEL_NOT_FOUND"


@pytest.mark.parametrize(
    ("rpc", "model", "serving"), [("Generate", "mlp", "Infer"), ("Infer", "byte-lm", "Generate")]
)
def test_a_model_called_through_the_wrong_rpc_names_the_one_that_serves_it(
    stub: pb_grpc.InferenceServiceStub, rpc: str, model: str, serving: str
) -> None:
    def call() -> object:
        if rpc == "Generate":
            return list(stub.Generate(pb.GenerateRequest(model=model, text="x"), timeout=30))
        return stub.Infer(pb.InferRequest(model=model, inputs=[tensor()]), timeout=30)

    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert details(info.value)[0] == "WRONG_METHOD"
    assert f"served by {serving}, not {rpc}" in (info.value.details() or "")


def test_oversized_grpc_request_is_resource_exhausted(stub: pb_grpc.InferenceServiceStub) -> None:
    big = np.zeros(5 * 1024 * 1024 // 4, dtype=np.float32)  # 5 MiB > the 4 MiB default limit
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(
            pb.InferRequest(model="mlp", inputs=[tensor(shape=[big.size], raw_contents=big.tobytes())]),
            timeout=30,
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details(info.value)[0] == "REQUEST_TOO_LARGE"


# -- the same through the shim ---------------------------------------------------------------------


def post(shim: ShimProcess, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(f"{shim.url}{path}", timeout=30, **kwargs)  # type: ignore[arg-type]


def fields_of(response: httpx.Response) -> list[str]:
    return [v["field"] for v in response.json()["error"]["field_violations"]]


def test_http_unknown_model_is_404(shim: ShimProcess) -> None:
    r = post(
        shim,
        "/v1/infer",
        json={
            "model": "nope",
            "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [0.0] * 512}],
        },
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_http_bad_sampling_names_the_same_field(
    shim: ShimProcess, body: dict[str, object], field: str
) -> None:
    r = post(shim, "/v1/generate", json={"model": "byte-lm", "prompt": "Hi", **body})
    assert r.status_code in (400, 422), r.text
    assert field in fields_of(r)


def test_http_wrong_shape_is_400_naming_the_input(shim: ShimProcess) -> None:
    r = post(
        shim,
        "/v1/infer",
        json={"model": "mlp", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [3], "data": [0.0] * 3}]},
    )
    assert r.status_code == 400, r.text
    assert any("inputs[0]" in f for f in fields_of(r))


def test_http_infer_on_a_generative_model_is_400_naming_generate(shim: ShimProcess) -> None:
    r = post(
        shim,
        "/v1/infer",
        json={"model": "byte-lm", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [1], "data": [0.0]}]},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["reason"] == "WRONG_METHOD" and "Generate" in r.json()["error"]["message"]


def test_http_malformed_json_is_400(shim: ShimProcess) -> None:
    r = post(
        shim,
        "/v1/generate",
        content=b'{"model": "byte-lm", "prompt": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["reason"] == "MALFORMED_JSON"


def test_http_oversized_body_is_413(shim: ShimProcess) -> None:
    r = post(
        shim,
        "/v1/generate",
        content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["reason"] == "REQUEST_TOO_LARGE"
