"""bench/eager_mlp.py and bench.admission's eager side: the benchmark MLP as a user's plugin (register_model,
an eager nn.Module) answers as the embedded, traced one does, and bench.admission can run just that side."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest
import torch

from bench import admission
from server.runtimes import registry
from server.runtimes.mlp import MlpModel
from server.runtimes.options import ModelContext


@pytest.fixture
def eager_plugin() -> Iterator[ModuleType]:
    """Imports the plugin (it re-registers `mlp`) and puts the embedded registration back afterwards."""
    saved = dict(registry._REGISTRY)
    sys.modules.pop("bench.eager_mlp", None)
    try:
        yield importlib.import_module("bench.eager_mlp")
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
        sys.modules.pop("bench.eager_mlp", None)


def test_the_plugin_serves_mlp_eagerly_with_the_embedded_outputs(eager_plugin: ModuleType) -> None:
    registration = registry._REGISTRY["mlp"]
    options = registration.options(width=64)
    context = ModelContext(device=torch.device("cpu"), max_batch_size=8, context_length=0, max_sequences=1)
    eager = registration.build(options, context)
    assert type(eager).__module__ == "bench.eager_mlp"
    assert not isinstance(eager.net, torch.jit.ScriptModule)  # a user's module, not a trace
    embedded = MlpModel(width=64, max_batch_size=8, device=torch.device("cpu"))
    assert eager.descriptor.inputs == embedded.descriptor.inputs
    assert eager.descriptor.outputs == embedded.descriptor.outputs
    rng = np.random.default_rng(0)
    batch = [{"x": rng.standard_normal(512).astype(np.float32)} for _ in range(5)]
    with torch.inference_mode():
        got, want = eager.forward(batch), embedded.forward(batch)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g["y"], w["y"], rtol=1e-5, atol=1e-6)


def test_bench_admission_runs_the_eager_side_alone() -> None:
    args = admission.parse_args(["--sides", "sluice-eager-h2load,plain-h2load", "--callers", "64"])
    args.h2load = True  # as where h2load is installed
    plan = admission.sides(args)
    assert sorted(side.key for side in plan) == ["plain-h2load", "sluice-eager-h2load"]
    eager = next(side for side in plan if side.key == "sluice-eager-h2load")
    assert eager.command[eager.command.index("--plugins") + 1] == "bench.eager_mlp"
    with pytest.raises(ValueError, match="unknown --sides"):
        admission.sides(admission.parse_args(["--sides", "no-such-side"]))
