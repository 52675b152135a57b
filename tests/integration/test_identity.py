"""Issue 11, point 4: a request's id (the caller's X-Request-Id, else one made) and its tenant travel HTTP ->
gRPC -> both processes' access logs -> the response's headers and gRPC trailers."""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

TOKEN = "identity-token"
BODY = {"model": "mlp", "inputs": [{"name": "x", "dtype": "FLOAT32", "shape": [512], "data": [1.0] * 512}]}
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    keys = tmp_path_factory.mktemp("identity") / "keys.toml"
    keys.write_text(
        f'[[tenant]]\nname = "alpha"\ntoken_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n'
    )
    server = start_server("--models", "mlp,byte-lm", "--auth-keys", str(keys), "--access-log", "1")
    shim = start_shim(server.target, "--auth-keys", str(keys), "--access-log", "1")
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0


def log_lines(path: Path | None) -> list[dict[str, object]]:
    assert path is not None
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def logged(path: Path | None, request_id: str) -> dict[str, object]:
    wait_until(lambda: any(line.get("request_id") == request_id for line in log_lines(path)), what=request_id)
    return next(line for line in log_lines(path) if line.get("request_id") == request_id)


def test_the_callers_request_id_and_the_tenant_go_everywhere(
    stack: tuple[ServerProcess, ShimProcess],
) -> None:
    server, shim = stack
    answer = httpx.post(f"{shim.url}/v1/infer", json=BODY, headers={**AUTH, "x-request-id": "req-abc-1"})
    assert answer.status_code == 200
    assert (answer.headers["x-request-id"], answer.headers["x-sluice-tenant"]) == ("req-abc-1", "alpha")
    assert answer.json()["request_id"] == "req-abc-1"
    in_server = logged(server.stderr_path, "req-abc-1")
    assert (in_server["tenant"], in_server["method"], in_server["status"]) == ("alpha", "Infer", "OK")
    in_shim = logged(shim.stderr_path, "req-abc-1")
    assert (in_shim["tenant"], in_shim["path"], in_shim["status"]) == ("alpha", "/v1/infer", 200)


def test_a_request_without_an_id_gets_one_and_streams_carry_it(
    stack: tuple[ServerProcess, ShimProcess],
) -> None:
    server, shim = stack
    body = {"model": "byte-lm", "prompt": "hi", "max_tokens": 3}
    with httpx.stream("POST", f"{shim.url}/v1/generate", json=body, headers=AUTH) as stream:
        request_id = stream.headers["x-request-id"]
        assert stream.status_code == 200 and len(request_id) == 16
        stream.read()
    assert logged(server.stderr_path, request_id)["method"] == "Generate"
    chat = {"model": "byte-lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answer = httpx.post(f"{shim.url}/v1/chat/completions", json=chat, headers={**AUTH, "x-request-id": "r-9"})
    assert answer.json()["id"] == "chatcmpl-r-9" and answer.headers["x-request-id"] == "r-9"


def test_grpc_trailers_say_which_call_and_whose(stack: tuple[ServerProcess, ShimProcess]) -> None:
    server, _ = stack
    x = np.ones(512, np.float32)
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        _, call = stub.Infer.with_call(
            pb.InferRequest(model="mlp", inputs=[tensor], request_id="g-1"),
            metadata=list(AUTH.items()),
            timeout=10,
        )
        unary = dict(call.trailing_metadata())
        stream = stub.Generate(
            pb.GenerateRequest(model="byte-lm", text="hi", sampling=pb.SamplingParams(max_tokens=2)),
            metadata=list(AUTH.items()),
            timeout=10,
        )
        list(stream)
        streamed = dict(stream.trailing_metadata())
    assert (unary["x-request-id"], unary["x-sluice-tenant"]) == ("g-1", "alpha")
    assert streamed["x-sluice-tenant"] == "alpha" and len(streamed["x-request-id"]) == 16


def test_a_long_request_id_is_clipped_in_the_trailers_not_refused(
    stack: tuple[ServerProcess, ShimProcess],
) -> None:
    """300 characters once failed the call INTERNAL 'Invalid metadata': the clip marker is not ASCII."""
    server, _ = stack
    x = np.ones(512, np.float32)
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    with grpc.insecure_channel(server.target) as channel:
        answer, call = pb_grpc.InferenceServiceStub(channel).Infer.with_call(
            pb.InferRequest(model="mlp", inputs=[tensor], request_id="r" * 300),
            metadata=list(AUTH.items()),
            timeout=10,
        )
    assert answer.request_id == "r" * 300
    echoed = urllib.parse.unquote(str(dict(call.trailing_metadata())["x-request-id"]))
    assert echoed.startswith("r" * 256) and "(300 chars)" in echoed
