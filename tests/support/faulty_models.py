"""A server plugin for tests: the `faulty` tensor model, the MLP with failures chosen by the input.

Load it with `--plugins tests.support.faulty_models --models faulty`. It also registers `wide`, the MLP four
times as wide (a model that needs more memory per request than `mlp`), and `bulky`, which takes a FLOAT32
vector of any length and answers its sum after 50 ms (requests of megabytes that stay in flight a while);
`vector-sum` is `bulky` without the wait.
`faulty` and `wide` are variants of `mlp`: `--model-options mlp.width=256` (or `--mlp-width 256`) sizes them.
An item of `faulty` whose x[0] is
  -1    raises torch.OutOfMemoryError for any batch that holds it (a forced OOM),
  NaN   raises ValueError for any batch that holds it (a bad item discovered late, inside forward),
  -2    makes the pass sleep x[1] seconds first (a slow model, to fill the queue),
and every other item is computed by the MLP. Like every runtime, this never imports grpc.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from server.domain import Array, DType, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.runtimes.base import TensorModel
from server.runtimes.mlp import MlpModel, MlpOptions
from server.runtimes.options import ModelContext
from server.runtimes.registry import register_model

OOM = -1.0
SLOW = -2.0


class FaultyModel(TensorModel):
    def __init__(self, *, width: int, max_batch_size: int, device: torch.device) -> None:
        self.mlp = MlpModel(width=width, max_batch_size=max_batch_size, device=device)
        self.descriptor = dataclasses.replace(
            self.mlp.descriptor, name="faulty", description="The MLP, failing on marked inputs (tests only)"
        )

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        heads = [float(item["x"][0]) for item in batch]
        if any(math.isnan(h) for h in heads):
            raise ValueError("x[0] is NaN")
        if OOM in heads:
            raise torch.OutOfMemoryError("forced out of memory: x[0] == -1")
        delays = [float(item["x"][1]) for item, h in zip(batch, heads, strict=True) if h == SLOW]
        if delays:
            time.sleep(max(delays))
        return self.mlp.forward(batch)


def _factory(options: MlpOptions, context: ModelContext) -> FaultyModel:
    return FaultyModel(width=options.width, max_batch_size=context.max_batch_size, device=context.device)


def _wide(options: MlpOptions, context: ModelContext) -> TensorModel:
    mlp = MlpModel(width=4 * options.width, max_batch_size=context.max_batch_size, device=context.device)
    mlp.descriptor = dataclasses.replace(mlp.descriptor, name="wide", description="A wider MLP (tests only)")
    return mlp


class BulkyModel(TensorModel):
    def __init__(self, *, max_batch_size: int, name: str = "bulky", delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.descriptor = ModelDescriptor(
            name=name,
            version="1",
            kind=ModelKind.TENSOR,
            description=f"Sum of a FLOAT32 vector of any length, after {delay_s * 1000:.0f} ms (tests only)",
            limits=ModelLimits(max_batch_size=max_batch_size),
            device="cpu",
            inputs=(TensorSpec("x", DType.FLOAT32, (-1,)),),
            outputs=(TensorSpec("y", DType.FLOAT32, (1,)),),
        )

    def bucket(self, inputs: Mapping[str, Array]) -> int:
        return int(inputs["x"].shape[0])

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [{"y": np.array([item["x"].sum()], dtype=np.float32)} for item in batch]

    def warmup(self, steps: int) -> None:
        self.forward([{"x": np.zeros(4, dtype=np.float32)}])


register_model("faulty", _factory, options_of="mlp")
register_model("bulky", lambda context: BulkyModel(max_batch_size=context.max_batch_size))
register_model("wide", _wide, options_of="mlp")
# `bulky` without the wait: what a large input costs on the way in, and nothing else (bench/kserve_shm.py).
register_model(
    "vector-sum",
    lambda context: BulkyModel(max_batch_size=context.max_batch_size, name="vector-sum", delay_s=0.0),
)
