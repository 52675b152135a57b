"""Acceptance 1: a real grpcurl lists services by reflection, describes the service, calls Infer,
streams Generate."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


def grpcurl(server: ServerProcess, *args: str, data: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [GRPCURL, "-plaintext", "-max-time", "30"]
    if data is not None:
        cmd += ["-d", data]
    return subprocess.run(
        [*cmd, server.target, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_lists_services_through_reflection(server: ServerProcess) -> None:
    out = grpcurl(server, "list")
    assert out.returncode == 0, out.stderr
    services = set(out.stdout.split())
    assert {"sluice.inference.v1.InferenceService", "grpc.health.v1.Health"} <= services


def test_describes_the_inference_service(server: ServerProcess) -> None:
    out = grpcurl(server, "describe", "sluice.inference.v1.InferenceService")
    assert out.returncode == 0, out.stderr
    for rpc in (
        "rpc Infer",
        "rpc Generate",
        "returns ( stream .sluice.inference.v1.GenerateResponse )",
        "rpc ListModels",
        "rpc GetModel",
    ):
        assert rpc in out.stdout


def test_infer_with_a_hand_typed_json_body(server: ServerProcess) -> None:
    body = {
        "model": "mlp",
        "inputs": [
            {
                "name": "x",
                "dtype": "DATA_TYPE_FLOAT32",
                "shape": [512],
                "contents": {"fp32Contents": [0.01 * i for i in range(512)]},
            }
        ],
        "typedOutputs": True,
    }
    out = grpcurl(server, "sluice.inference.v1.InferenceService/Infer", data=json.dumps(body))
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    (output,) = reply["outputs"]
    assert output["name"] == "y" and output["shape"] == ["512"]
    # grpcurl prints the proto field names.
    assert len(output["contents"]["fp32_contents"]) == 512
    assert reply["timings"]["batch_size"] >= 1


def test_streams_generate(server: ServerProcess) -> None:
    body = {
        "model": "byte-lm",
        "text": "Hello",
        "sampling": {"maxTokens": 12, "seed": "7", "temperature": 0.8},
    }
    out = grpcurl(server, "sluice.inference.v1.InferenceService/Generate", data=json.dumps(body))
    assert out.returncode == 0, out.stderr
    decoder, text, messages, pos = json.JSONDecoder(), out.stdout.strip(), [], 0
    while pos < len(text):
        message, pos = decoder.raw_decode(text, pos)
        messages.append(message)
        pos = len(text) - len(text[pos:].lstrip())
    assert len(messages) >= 2, "a stream, not one message"
    assert messages[-1]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert messages[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    assert sum(len(m.get("token_ids", [])) for m in messages) == 12
    # The tokens the seeded model samples at that temperature: grpcurl carried the model's answer.
    sampled = [t for m in messages for t in m.get("token_ids", [])]
    assert sampled == byte_lm_reference.generate("Hello", 12, seed=7, temperature=0.8)


@pytest.mark.parametrize("service", ["", "sluice.inference.v1.InferenceService"])
def test_health_check_is_serving(server: ServerProcess, service: str) -> None:
    out = grpcurl(server, "grpc.health.v1.Health/Check", data=json.dumps({"service": service}))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "SERVING"


def _messages(stdout: str) -> list[dict[str, object]]:
    decoder, text, messages, pos = json.JSONDecoder(), stdout.strip(), [], 0
    while pos < len(text):
        message, pos = decoder.raw_decode(text, pos)
        messages.append(message)
        pos = len(text) - len(text[pos:].lstrip())
    return messages


def test_constrained_generate_and_a_tool_call_by_hand(server: ServerProcess) -> None:
    """Issue 20: a constraint and a named tool call typed as grpcurl JSON, every sample valid."""
    method = "sluice.inference.v1.InferenceService/Generate"
    for seed in range(5):
        body = {"model": "byte-lm", "text": "x", "sampling": {"seed": str(seed)},
                "constraint": {"regex": "[0-9]{3}-[a-z]{2}"}}  # fmt: skip
        out = grpcurl(server, method, data=json.dumps(body))
        assert out.returncode == 0, out.stderr
        messages = _messages(out.stdout)
        assert re.fullmatch("[0-9]{3}-[a-z]{2}", "".join(str(m.get("text", "")) for m in messages))
    schema = {"type": "object", "properties": {"q": {"enum": ["a", "b"]}}, "required": ["q"]}
    tool = {"name": "lookup", "parametersJson": json.dumps(schema)}
    body = {
        "model": "byte-lm", "chat": {"messages": [{"role": "user", "content": "find"}]}, "tools": [tool],
        "toolChoice": {"function": "lookup"}, "sampling": {"seed": "1", "maxTokens": 120},
    }  # fmt: skip
    out = grpcurl(server, method, data=json.dumps(body))
    assert out.returncode == 0, out.stderr
    last = _messages(out.stdout)[-1]
    assert last["finish_reason"] == "FINISH_REASON_TOOL_CALLS"
    (call,) = last["tool_calls"]  # type: ignore[misc]
    assert call["name"] == "lookup" and json.loads(call["arguments"])["q"] in ("a", "b")
