"""Issue 34, item 1: a plugin written for 0.1.0 (its factory takes (settings, device)) still loads and serves,
warned as deprecated (python's DeprecationWarning at its register_model line, and the server's log line)
naming ModelContext and 0.3.0, the release that drops it; a plugin of the ModelContext form beside it serves
without a warning."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from clients import SluiceClient
from tests.support.processes import ServerProcess

# 0.1.0's README example, as written then, with the server setting its factories read (settings.mlp_width
# became --model-options mlp.width; a former factory still reads it under its old name).
FORMER_PLUGIN = """
import numpy as np, torch
from server.domain import DType, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.runtimes.base import TensorModel
from server.runtimes.registry import register_model


class Doubler(TensorModel):
    def __init__(self, device: torch.device, max_batch_size: int, width: int) -> None:
        self.descriptor = ModelDescriptor(
            name="doubler",
            version=str(width),
            kind=ModelKind.TENSOR,
            description="x * 2",
            limits=ModelLimits(max_batch_size=max_batch_size),
            device=str(device),
            inputs=(TensorSpec("x", DType.FLOAT32, (-1,)),),
            outputs=(TensorSpec("y", DType.FLOAT32, (-1,)),),
        )

    def bucket(self, inputs):
        return inputs["x"].shape[0]

    def forward(self, batch):
        x = torch.from_numpy(np.stack([item["x"] for item in batch]))
        return [{"y": row} for row in (x * 2).numpy()]


register_model(
    "doubler", lambda settings, device: Doubler(device, settings.max_batch_size, settings.mlp_width)
)
"""

# The same model in the form the README shows now.
CONTEXT_PLUGIN = FORMER_PLUGIN.replace('name="doubler"', 'name="twice"').replace(
    """register_model(
    "doubler", lambda settings, device: Doubler(device, settings.max_batch_size, settings.mlp_width)
)""",
    'register_model("twice", lambda context: Doubler(context.device, context.max_batch_size, 0))',
)

CLI = ["-c", "import sys; from launcher.cli import main; sys.exit(main())"]


def test_a_former_plugin_serves_with_a_deprecation_beside_a_context_plugin_without_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "former_models.py").write_text(FORMER_PLUGIN)
    (tmp_path / "context_models.py").write_text(CONTEXT_PLUGIN)
    flags = ["serve", "--plugins", "former_models,context_models", "--models", "doubler,twice"]
    flags += [
        "--model-options",
        "mlp.width=24",
        "--max-batch-size",
        "7",
        "--port",
        "0",
        "--metrics-port",
        "0",
    ]
    # Python shows a DeprecationWarning raised outside __main__ only when asked: ask for every one the plugin
    # modules' lines raise (so this also checks the warning is attributed to the plugin's line).
    warnings = "always::DeprecationWarning:former_models,always::DeprecationWarning:context_models"
    server = ServerProcess(flags, entry=CLI, cwd=tmp_path, env={"PYTHONWARNINGS": warnings})
    try:
        server.wait_listening()
        server.wait_ready()
        with SluiceClient(server.target) as client:
            for name in ("doubler", "twice"):
                y = client.infer(name, {"x": np.arange(4, dtype=np.float32)}).outputs["y"]
                np.testing.assert_array_equal(y, [0, 2, 4, 6])
            doubler = next(m for m in client.list_models() if m.name == "doubler")
        assert doubler.version == "24", "the former factory reads --model-options mlp.width as mlp_width"
        assert doubler.max_batch_size == 7, "and the server's settings, as it did"
        output = "\n".join(server.lines)
        python_warning = re.search(
            r"former_models\.py:(\d+): DeprecationWarning: register_model\('doubler'\): a factory "
            r"taking \(settings, device\) is deprecated and will stop working in Sluice 0\.3\.0; take a "
            r"ModelContext",
            output,
        )
        assert python_warning, server.diagnostics()
        line = int(python_warning.group(1))
        assert FORMER_PLUGIN.splitlines()[line - 1].startswith("register_model("), "names the plugin's line"
        assert re.search(
            r"WARNING server\.runtimes\.registry: register_model\('doubler'\): a factory taking \(settings, "
            r"device\) is deprecated and will stop working in Sluice 0\.3\.0; take a ModelContext",
            output,
        ), server.diagnostics()
        assert "twice" not in "".join(line for line in server.lines if "deprecated" in line)
        assert "context_models.py" not in output, "a ModelContext factory is not warned about"
    finally:
        assert server.stop(30) == 0, server.diagnostics()
