"""Access logs (issue 8, item 7): with --access-log 1 every call writes one JSON line (method, model, status,
reason, queue and compute ms, request id); a request id is generated when the caller sends none and comes
back in the answer (Infer) or the trailers (Generate); off by default."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import numpy as np
import openai
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, start_server, start_shim, wait_until

X = np.ones(512, np.float32)


def infer(request_id: str = "", model: str = "mlp") -> pb.InferRequest:
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=X.tobytes())
    return pb.InferRequest(model=model, inputs=[tensor], request_id=request_id)


@pytest.fixture(scope="module")
def logged() -> Iterator[ServerProcess]:
    server = start_server("--access-log", "1")
    yield server
    assert server.terminate() == 0, server.diagnostics()


def lines(server: ServerProcess) -> list[dict[str, object]]:
    assert server.stderr_path is not None
    out = []
    for line in server.stderr_path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_every_call_writes_one_json_line_and_ids_are_generated(logged: ServerProcess) -> None:
    with grpc.insecure_channel(logged.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        named = stub.Infer(infer("abc-1"), timeout=30)
        anonymous = stub.Infer(infer(), timeout=30)
        # ignore_eos: the five tokens the log must count, whatever the model's weights say.
        sampling = pb.SamplingParams(max_tokens=5, ignore_eos=True)
        stream = stub.Generate(pb.GenerateRequest(model="byte-lm", text="hi", sampling=sampling), timeout=30)
        replies = list(stream)
        trailers = dict(stream.trailing_metadata() or ())
        with pytest.raises(grpc.RpcError):
            stub.Infer(infer("bad-1", model="nope"), timeout=30)
    assert named.request_id == "abc-1"
    assert len(anonymous.request_id) == 16  # generated: 8 random bytes in hex
    assert len(str(trailers["x-request-id"])) == 16
    assert replies[-1].usage.completion_tokens == 5
    wait_until(lambda: len(lines(logged)) >= 4, what="four access-log lines")
    by_id = {line["request_id"]: line for line in lines(logged)}
    ok = by_id["abc-1"]
    assert (ok["method"], ok["model"], ok["status"], ok["reason"]) == ("Infer", "mlp", "OK", None)
    assert isinstance(ok["compute_ms"], float) and ok["compute_ms"] > 0 and ok["batch_size"] == 1
    assert by_id[anonymous.request_id]["status"] == "OK"
    generated = by_id[str(trailers["x-request-id"])]
    assert (generated["method"], generated["tokens"], generated["status"]) == ("Generate", 5, "OK")
    refused = [line for line in lines(logged) if line["status"] == "NOT_FOUND"]
    assert refused and refused[-1]["reason"] == "MODEL_NOT_FOUND" and refused[-1]["model"] is None


def test_no_access_log_by_default(server: ServerProcess, stub: pb_grpc.InferenceServiceStub) -> None:
    stub.Infer(infer("quiet-1"), timeout=30)
    assert server.stderr_path is not None
    assert "quiet-1" not in server.stderr_path.read_text()


def test_the_openai_user_reaches_the_access_log(logged: ServerProcess) -> None:
    shim = start_shim(logged.target)
    try:
        with openai.OpenAI(base_url=f"{shim.url}/v1", api_key="unused", max_retries=0) as client:
            for user in ("alice@example.com", "zoë\nnext line"):
                client.chat.completions.create(
                    model="byte-lm", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user=user
                )
    finally:
        shim.terminate()
    wait_until(lambda: sum("user" in line for line in lines(logged)) >= 2, what="two lines naming a user")
    users = [line["user"] for line in lines(logged) if "user" in line]
    assert users[-2:] == ["alice@example.com", "zo%C3%AB%0Anext line"]  # gRPC metadata is printable ASCII
