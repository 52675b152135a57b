"""Issue 21, acceptance 1 (gRPC): unchanged tritonclient 2.73.0 (from .venv-triton, which `make test` builds:
it needs protobuf < 7) against the real server, in a subprocess, with outputs equal to Sluice's own Infer
and Generate on the same inputs."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import numpy as np
import pytest

from clients import SluiceClient
from tests.support.processes import ROOT, ServerProcess, wait_until

TRITON_PY = ROOT / ".venv-triton" / "bin" / "python"
PROBE = ROOT / "tests" / "support" / "triton_probe.py"
PROMPT, MAX_TOKENS = "Hello v2", 12
X = np.random.default_rng(21).standard_normal((2, 512)).astype(np.float32)


def probe_command(scenario: str, target: str, given: dict[str, Any]) -> list[str]:
    if not TRITON_PY.exists():
        pytest.fail(f"{TRITON_PY} is missing: `make test` builds it (bash scripts/setup_triton.sh)")
    return [str(TRITON_PY), str(PROBE), scenario, target, json.dumps(given)]


def run_probe(scenario: str, target: str, given: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        probe_command(scenario, target, given), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


TEXTS = ["hello world", "the Open Inference Protocol"]
GIVEN = {"x": X.tolist(), "prompt": PROMPT, "max_tokens": MAX_TOKENS, "texts": TEXTS}


@pytest.fixture(scope="module")
def grpc_run(server: ServerProcess) -> dict[str, Any]:
    return run_probe("grpc", server.target, GIVEN)


@pytest.fixture(scope="module")
def own(server: ServerProcess) -> tuple[np.ndarray, str]:
    """Sluice's own Infer on each row and its own greedy Generate on the prompt."""
    with SluiceClient(server.target) as client:
        rows = np.stack([client.infer("mlp", {"x": row}).outputs["y"] for row in X])
        text = "".join(
            c.text for c in client.generate("byte-lm", PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        )
    return rows, text


def test_health_and_readiness(grpc_run: dict[str, Any]) -> None:
    assert (grpc_run["live"], grpc_run["ready"], grpc_run["model_ready"]) == (True, True, True)
    assert grpc_run["missing_ready"] is False
    assert grpc_run["server_metadata"]["name"] == "sluice"
    assert "system_shared_memory" in grpc_run["server_metadata"]["extensions"]


def test_metadata_and_config_are_what_triton_clients_read(grpc_run: dict[str, Any]) -> None:
    meta = grpc_run["metadata"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "512"]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["-1", "512"]}]
    config = grpc_run["config"]["config"]
    assert int(config["max_batch_size"]) >= 2
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["512"]}]
    assert config["dynamic_batching"]["priority_levels"] == "3"
    lm = grpc_run["lm_config"]["config"]
    assert lm["model_transaction_policy"] == {"decoupled": True}
    assert lm["input"][0]["name"] == "text_input" and lm["output"][0]["name"] == "text_output"


def test_infer_outputs_equal_sluices_own_infer(grpc_run: dict[str, Any], own: tuple[np.ndarray, str]) -> None:
    rows, _ = own
    for key in ("y", "y_contents", "y_async", "y_stream"):
        np.testing.assert_allclose(np.array(grpc_run[key], dtype=np.float32), rows, rtol=1e-5, atol=1e-6)
    assert grpc_run["id"] == "r-1"


def test_bytes_in_and_int32_out_equal_sluices_own_infer(
    grpc_run: dict[str, Any], server: ServerProcess
) -> None:
    with SluiceClient(server.target) as client:
        own = [client.infer("all-minilm-l6-v2", {"text": [t]}).outputs for t in TEXTS]
    assert grpc_run["embedding_datatypes"] == ["FP32", "INT32"]
    for row, outputs in enumerate(own):
        # A text's vector depends on its batch mates only through float rounding (README, Embeddings).
        np.testing.assert_allclose(grpc_run["embedding"][row], outputs["embedding"], atol=1e-5)
        assert grpc_run["tokens"][row] == outputs["tokens"].tolist()


def test_stream_streams_the_tokens_of_sluices_own_generate(
    grpc_run: dict[str, Any], own: tuple[np.ndarray, str]
) -> None:
    stream = grpc_run["stream"]
    assert len(stream["pieces"]) > 1, "tokens arrive as they are made, not in one response"
    assert "".join(stream["pieces"]) == own[1]
    assert stream["finish"] == "length" and stream["ids"] == ["stream-1"]


def test_errors_name_the_input_with_the_canonical_code(grpc_run: dict[str, Any]) -> None:
    assert grpc_run["wrong_shape"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "'x'" in grpc_run["wrong_shape"]["message"] and "[1, 7]" in grpc_run["wrong_shape"]["message"]
    assert grpc_run["wrong_datatype"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "FP32" in grpc_run["wrong_datatype"]["message"]
    assert "'z'" in grpc_run["unknown_input"]["message"]
    assert grpc_run["missing_model"]["status"] == "StatusCode.NOT_FOUND"
    assert grpc_run["repository"]["status"] == "StatusCode.UNIMPLEMENTED"
    assert "fixed at start-up" in grpc_run["repository"]["message"]
    assert grpc_run["infer_generate_model"]["status"] == "StatusCode.FAILED_PRECONDITION"


def test_grpc_aio_client(server: ServerProcess, own: tuple[np.ndarray, str]) -> None:
    result = run_probe("aio", server.target, GIVEN)
    assert result["live"] and result["model_ready"]
    for ys in result["ys"]:
        np.testing.assert_allclose(np.array(ys, dtype=np.float32), own[0], rtol=1e-5, atol=1e-6)
    assert "".join(result["pieces"]) == own[1]


def test_a_cancelled_stream_frees_its_slot(server: ServerProcess) -> None:
    labels = {"model": "byte-lm", "method": "ModelStreamInfer"}
    admitted = server.metric("sluice_requests_admitted_total", **labels)
    produced = server.metric("sluice_tokens_generated_total", model="byte-lm")
    with subprocess.Popen(
        probe_command("cancel", server.target, {"max_tokens": 1000}),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdin is not None
            line = json.loads(proc.stdout.readline() or "{}")
            assert line.get("answered"), f"no first token: {line}"
            assert server.metric("sluice_requests_admitted_total", **labels) == admitted + 1
            # The client is still connected: only the cancellation can have given the slot back.
            wait_until(
                lambda: server.metric("sluice_requests_in_flight", **labels) == 0, what="the slot given back"
            )
            wait_until(
                lambda: server.metric("sluice_sequences_active", model="byte-lm") == 0, what="no sequence"
            )
            assert server.metric("sluice_tokens_generated_total", model="byte-lm") - produced < 1000
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
