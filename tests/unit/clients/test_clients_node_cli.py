"""clients/node/cli.js over the wire against the scripted server, parsed as JSON lines.

Skipped where Node or the client's node_modules (installed by `make test-tools`) are missing; under
`make test` that fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the fixture's type only; tests never import conftest at run time
    from tests.unit.clients.conftest import FakeServer

NODE_CLIENT = Path(__file__).resolve().parents[3] / "clients" / "node"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None or not (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir(),
    reason="needs node and `npm ci` in clients/node (make test-tools)",
)


def _cli(server: FakeServer, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    assert NODE is not None
    done = subprocess.run(
        [NODE, "cli.js", "--target", server.target, "--timeout", "20", *args],
        cwd=NODE_CLIENT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_models_prints_one_line_per_model(fake_server: FakeServer) -> None:
    code, lines, _ = _cli(fake_server, "models")
    assert code == 0
    assert [(m["name"], m["kind"]) for m in lines] == [("double", "tensor"), ("echo", "generative")]
    assert lines[1]["context_length"] == 2048


def test_infer_fills_the_models_input(fake_server: FakeServer) -> None:
    code, lines, _ = _cli(fake_server, "infer", "double", "--fill", "1.5", "--size", "4")
    assert code == 0
    (line,) = lines
    assert line["outputs"]["x"] == {"dtype": "float32", "shape": [4], "data": [3.0, 3.0, 3.0, 3.0]}
    assert (line["queue_wait_s"], line["batch_size"]) == (0.25, 3)
    sent = fake_server.service.infer_requests[-1].inputs[0]
    assert (sent.name, list(sent.shape), len(sent.raw_contents)) == ("x", [4], 16)


def test_generate_prints_chunks_then_finish(fake_server: FakeServer) -> None:
    args = ("generate", "echo", "one two three", "--max-tokens", "2", "--seed", "7")
    code, lines, _ = _cli(fake_server, *args)
    assert code == 0
    assert [line["text"] for line in lines[:-1]] == ["one ", "two "]
    assert lines[-1]["finish_reason"] == "length"
    assert lines[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    sampling = fake_server.service.generate_requests[-1].sampling
    assert (sampling.max_tokens, sampling.seed, sampling.HasField("temperature")) == (2, 7, False)


def test_errors_print_decoded_details_and_exit_1(fake_server: FakeServer) -> None:
    code, lines, stderr = _cli(fake_server, "infer", "overloaded", "--input", "x", "--size", "1")
    assert (code, lines) == (1, [])
    error = json.loads(stderr)["error"]
    assert (error["code_name"], error["reason"]) == ("RESOURCE_EXHAUSTED", "QUEUE_FULL")
    assert error["retry_after"] == 1.5


def test_unary_calls_are_retried_on_unavailable(fake_server: FakeServer) -> None:
    code, _, _ = _cli(fake_server, "infer", "flaky", "--input", "x", "--size", "1")
    assert code == 0
    assert fake_server.service.infer_attempts["flaky"] == 3
