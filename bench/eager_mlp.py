"""The benchmark MLP as a user's plugin would serve it: `mlp` re-registered as the eager nn.Module, no trace.

    python -m server --plugins bench.eager_mlp --models mlp

The README's "Adding your own model" recipe applied to `build_mlp` (the same seeded weights, input `x` and
output `y` as the embedded model): forward stacks the items, runs the module eagerly (the worker thread is
already under inference_mode) and hands back one row per item. It replaces the embedded, traced `mlp`, so
the same request serves either, and bench.admission compares the two with the plain batcher, which runs
the very same eager module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from server.domain import Array, DType, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.runtimes.base import TensorModel
from server.runtimes.mlp import MlpOptions, build_mlp
from server.runtimes.options import ModelContext
from server.runtimes.registry import register_model

FEATURES = 512


class EagerMlp(TensorModel):
    """Input `x` FLOAT32 [512] per item, output `y` FLOAT32 [512]; eager torch on the CPU."""

    def __init__(self, *, width: int, max_batch_size: int) -> None:
        self.net = build_mlp(width, features=FEATURES)
        self.descriptor = ModelDescriptor(
            name="mlp",
            version="1",
            kind=ModelKind.TENSOR,
            description=f"Seeded MLP {FEATURES}->{width}x3->{FEATURES} with GELU (float32, eager plugin)",
            limits=ModelLimits(max_batch_size=max_batch_size),
            device="cpu",
            inputs=(TensorSpec("x", DType.FLOAT32, (FEATURES,)),),
            outputs=(TensorSpec("y", DType.FLOAT32, (FEATURES,)),),
        )

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        x = torch.from_numpy(np.stack([item["x"] for item in batch]))
        return [{"y": row} for row in self.net(x).numpy()]


def _factory(options: MlpOptions, context: ModelContext) -> EagerMlp:
    return EagerMlp(width=options.width, max_batch_size=context.max_batch_size)


register_model("mlp", _factory, options=MlpOptions)
