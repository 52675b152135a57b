"""Issue 21, REST v2 on the shim: unchanged tritonclient.http (from .venv-triton) for health, metadata,
config and infer with JSON and binary tensors, equal to Sluice's own Infer; the generate extension as
JSON and SSE; errors in the protocol's `{"error": "..."}` shape with the status of the gRPC code."""

from __future__ import annotations

import json
import struct
from typing import Any

import httpx
import numpy as np
import pytest

from clients import SluiceClient
from tests.integration.test_kserve_tritonclient import X, run_probe
from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess, ShimProcess


@pytest.fixture(scope="module")
def http_run(shim: ShimProcess) -> dict[str, Any]:
    return run_probe("http", shim.url.removeprefix("http://"), {"x": X.tolist()})


@pytest.fixture(scope="module")
def own_rows(server: ServerProcess) -> np.ndarray:
    with SluiceClient(server.target) as client:
        return np.stack([client.infer("mlp", {"x": row}).outputs["y"] for row in X])


def test_tritonclient_http_health_and_metadata(http_run: dict[str, Any]) -> None:
    assert (http_run["live"], http_run["ready"], http_run["model_ready"]) == (True, True, True)
    assert http_run["missing_ready"] is False
    assert http_run["metadata"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 512]}]
    assert http_run["config"]["max_batch_size"] >= 2
    assert http_run["config"]["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [512]}]


def test_tritonclient_http_infer_binary_and_json_equal_sluices_own(
    http_run: dict[str, Any], own_rows: np.ndarray
) -> None:
    for key in ("y_binary", "y_json", "y_async", "y_shm"):
        np.testing.assert_allclose(np.array(http_run[key], dtype=np.float32), own_rows, rtol=1e-5, atol=1e-6)
    assert http_run["binary_sized"], "binary_data outputs travel after the JSON, sized in its parameters"
    assert http_run["id"] == "h-1"
    assert http_run["wrong_shape"]["status"] == "400" and "'x'" in http_run["wrong_shape"]["message"]


def test_tritonclient_http_shared_memory(http_run: dict[str, Any]) -> None:
    assert [r["name"] for r in http_run["shm_status"]] == ["http-in"]
    assert http_run["shm_status_after"] == []


def test_shared_memory_for_a_client_on_another_host_is_refused(shim: ShimProcess) -> None:
    """Issue 36: the server sees the shim's loopback address; the shim passes its client's on. A local proxy's
    X-Forwarded-For (uvicorn trusts 127.0.0.1's) stands for a client elsewhere, as a remote one would."""
    elsewhere = {"x-forwarded-for": "10.1.2.3"}
    body = {"key": "/sluice-shm-nothing", "offset": 0, "byte_size": 64}
    register = f"{shim.url}/v2/systemsharedmemory/region/r/register"
    for answer in (
        httpx.post(register, json=body, headers=elsewhere, timeout=10),
        httpx.get(f"{shim.url}/v2/systemsharedmemory/status", headers=elsewhere, timeout=10),
        httpx.post(f"{shim.url}/v2/systemsharedmemory/unregister", headers=elsewhere, timeout=10),
    ):
        assert answer.status_code == 403, answer.text
        assert "10.1.2.3" in answer.json()["error"]
    shared = {"shared_memory_region": "r", "shared_memory_byte_size": 2048}
    by_reference = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "parameters": shared}]}
    infer = f"{shim.url}/v2/models/mlp/infer"
    answer = httpx.post(infer, json=by_reference, headers=elsewhere, timeout=10)
    assert answer.status_code == 403 and "10.1.2.3" in answer.json()["error"], answer.text
    local = httpx.post(register, json=body, timeout=10)  # from here: refused only for the missing object
    assert local.status_code == 400 and "no shared-memory object" in local.json()["error"], local.text


def test_binary_extension_by_hand(shim: ShimProcess, own_rows: np.ndarray) -> None:
    sized = {"binary_data_size": X.nbytes}
    header = json.dumps({
        "inputs": [{"name": "x", "shape": [2, 512], "datatype": "FP32", "parameters": sized}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    answer = httpx.post(
        f"{shim.url}/v2/models/mlp/infer",
        content=header + X.tobytes(),
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
    )
    assert answer.status_code == 200, answer.text
    size = int(answer.headers["Inference-Header-Content-Length"])
    document = json.loads(answer.content[:size])
    assert document["outputs"][0]["parameters"]["binary_data_size"] == own_rows.nbytes
    y = np.frombuffer(answer.content[size:], dtype="<f4").reshape(2, 512)
    np.testing.assert_allclose(y, own_rows, rtol=1e-5, atol=1e-6)


def test_generate_and_generate_stream(shim: ShimProcess, server: ServerProcess) -> None:
    with SluiceClient(server.target) as client:
        own = "".join(c.text for c in client.generate("byte-lm", "Hi v2", max_tokens=10, temperature=0))
    body = {"text_input": "Hi v2", "parameters": {"max_tokens": 10, "temperature": 0}}
    whole = httpx.post(f"{shim.url}/v2/models/byte-lm/generate", json=body, timeout=60).json()
    assert whole["text_output"] == own and whole["finish_reason"] == "length"
    assert own == byte_lm_reference.text(byte_lm_reference.generate("Hi v2", 10, temperature=0))
    with httpx.stream("POST", f"{shim.url}/v2/models/byte-lm/generate_stream", json=body, timeout=60) as sse:
        assert sse.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in sse.iter_lines() if line.startswith("data: ")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == own
    assert events[-1]["finish_reason"] == "length"


def _x(shape: list[int], datatype: str, data: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v2/models/missing/infer", _x([1], "FP32", [1]), 404, "missing"),
        ("/v2/models/mlp/infer", _x([1, 512], "INT64", [0] * 512), 400, "FP32"),
        ("/v2/models/mlp/infer", _x([1, 2], "FP32", [[1, 2], [3]]), 400, "inputs[0].data"),
        ("/v2/models/mlp/infer", {"inputs": []}, 400, "inputs"),
        ("/v2/models/byte-lm/generate", {"text_input": "hi", "max_tokens": 100000}, 400, "max_tokens"),
        ("/v2/models/byte-lm/generate", {"prompt": "hi"}, 400, "text_input"),
    ],
)  # fmt: skip
def test_errors_are_the_protocols_shape(
    shim: ShimProcess, path: str, body: Any, status: int, needle: str
) -> None:
    answer = httpx.post(f"{shim.url}{path}", json=body, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert isinstance(error, str) and needle in error


def test_a_form_post_is_refused_but_no_content_type_is_read(shim: ShimProcess) -> None:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]})
    form = httpx.post(f"{shim.url}/v2/models/mlp/infer", content=body, headers={"Content-Type": "text/plain"})
    assert form.status_code == 415 and isinstance(form.json()["error"], str)
    bare = httpx.post(f"{shim.url}/v2/models/mlp/infer", content=body)  # as tritonclient.http sends it
    assert bare.status_code == 200 and bare.json()["outputs"][0]["shape"] == [1, 512]


def test_bytes_length_prefix_is_read_as_the_protocol_says() -> None:
    from shim.kserve.translate import from_raw, to_raw

    raw = to_raw(["ab", "é"], "BYTES", "inputs[0]")
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "é".encode()
    assert from_raw(raw, "BYTES") == ["ab", "é"]
