"""The Node client's wire names (clients/node/wire.js) are the Python side's (the `wire` package): each
value it exports is read by Node itself and compared with the constant of the same name."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.support.processes import ROOT
from wire import errors, metadata

NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_every_node_wire_name_is_the_python_one() -> None:
    assert NODE is not None
    out = subprocess.run(
        [NODE, "-e", "process.stdout.write(JSON.stringify(require('./clients/node/wire.js')))"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    exported: dict[str, str] = json.loads(out.stdout)
    assert exported, "wire.js exports nothing"
    for name, value in exported.items():
        python = getattr(metadata, name, None) or getattr(errors, name, None)
        assert python is not None, f"wire.js names {name}, which the wire package does not"
        assert value == python, (name, value, python)
    # What the Node client itself sends or looks up is there.
    assert {"INFERENCE_SERVICE", "READINESS_SERVICE", "AUTHORIZATION", "REQUEST_ID", "DOMAIN"} <= set(
        exported
    )
