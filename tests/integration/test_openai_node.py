"""The official `openai` npm package streams a chat completion through the shim (issue 9, acceptance 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import ROOT, ShimProcess

NODE_MODULES = ROOT / "clients" / "node" / "node_modules"
SCRIPT = ROOT / "tests" / "integration" / "node" / "openai_chat_stream.js"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "openai").is_dir(),
    reason="node or the openai npm package missing (make test-tools runs npm ci in clients/node)",
)


def run_script(script: Path, *args: str) -> dict[str, Any]:
    """A script's one JSON line, run with the npm packages of clients/node."""
    out = subprocess.run(
        ["node", str(script), *args],
        env={**os.environ, "NODE_PATH": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_the_node_sdk_streams_a_chat_completion(shim: ShimProcess) -> None:
    result = run_script(SCRIPT, f"{shim.url}/v1", "byte-lm")
    assert result["role"] == "assistant" and result["chunks"] >= 3
    assert result["streamed"] == result["whole"] and result["streamed"]


def test_the_node_sdk_gets_schema_valid_json_and_tool_calls(shim: ShimProcess) -> None:
    """Issue 20, acceptance 1: the npm `openai` package, unchanged, against the shim."""
    import jsonschema

    script = ROOT / "tests" / "integration" / "node" / "openai_structured.js"
    result = run_script(script, f"{shim.url}/v1", "byte-lm", "50")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    for content in result["contents"]:
        jsonschema.validate(json.loads(content), schema)
    (call,) = result["call"]
    assert result["finish"] == "tool_calls" and call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    assert [d["function"]["arguments"] for d in result["deltas"]] == [call["function"]["arguments"]]
