"""Issue 21, what to build 5: the Node example (clients/node/kserve.js, @grpc/grpc-js with the protocol's
own proto) against the real server: health, metadata, ModelInfer equal to the model, a streamed Generate
equal to Sluice's own greedy Generate."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from clients import SluiceClient
from tests.integration.test_python_client import reference_mlp
from tests.support.processes import ROOT, ServerProcess

NODE_DIR = ROOT / "clients" / "node"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_DIR / "node_modules").is_dir(),
    reason="node or clients/node/node_modules missing (make test-tools runs npm ci)",
)


def test_the_node_kserve_example(server: ServerProcess) -> None:
    flags = ["--target", server.target, "--fill", "0.25", "--prompt", "Node", "--max-tokens", "6"]
    done = subprocess.run(
        ["node", "kserve.js", *flags], cwd=NODE_DIR, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    steps = {line["step"]: line for line in map(json.loads, done.stdout.splitlines())}
    assert steps["live"]["live"] is True
    assert steps["metadata"]["inputs"][0]["shape"] == [-1, 512]
    assert steps["infer"]["id"] == "node-1" and steps["infer"]["shape"] == [1, 512]
    expected = reference_mlp(np.full(512, 0.25, dtype=np.float32))
    np.testing.assert_allclose(
        np.array(steps["infer"]["y"], dtype=np.float32), expected, rtol=1e-4, atol=1e-5
    )
    with SluiceClient(server.target) as client:
        own = "".join(c.text for c in client.generate("byte-lm", "Node", max_tokens=6, temperature=0))
    assert "".join(steps["stream"]["pieces"]) == own
