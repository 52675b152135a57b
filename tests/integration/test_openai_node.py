"""The official `openai` npm package streams a chat completion through the shim (issue 9, acceptance 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.support.processes import ROOT, ShimProcess

NODE_MODULES = ROOT / "clients" / "node" / "node_modules"
SCRIPT = ROOT / "tests" / "integration" / "node" / "openai_chat_stream.js"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "openai").is_dir(),
    reason="node or the openai npm package missing (scripts/setup.sh runs npm ci in clients/node)",
)


def test_the_node_sdk_streams_a_chat_completion(shim: ShimProcess) -> None:
    out = subprocess.run(
        ["node", str(SCRIPT), f"{shim.url}/v1", "byte-lm"],
        env={**os.environ, "NODE_PATH": str(NODE_MODULES)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["role"] == "assistant" and result["chunks"] >= 3
    assert result["streamed"] == result["whole"] and result["streamed"]
