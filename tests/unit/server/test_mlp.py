"""The embedded MLP serves a TorchScript trace; it must answer exactly what the eager module answers."""

from __future__ import annotations

import numpy as np
import torch

from server.runtimes.mlp import MlpModel, build_mlp


def test_the_traced_mlp_matches_eager_at_every_batch_size() -> None:
    model = MlpModel(width=256, max_batch_size=32, device=torch.device("cpu"))
    assert isinstance(model.net, torch.jit.ScriptModule), "the server runs the trace, not the eager module"
    eager = build_mlp(256)
    rng = np.random.default_rng(3)
    for size in (1, 3, 32):
        items = [{"x": rng.standard_normal(512).astype(np.float32)} for _ in range(size)]
        with torch.inference_mode():
            served = model.forward(items)
            expected = eager(torch.from_numpy(np.stack([item["x"] for item in items]))).numpy()
        assert len(served) == size
        np.testing.assert_array_equal(np.stack([out["y"] for out in served]), expected)
