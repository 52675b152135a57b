"""A server plugin for tests: the `faulty` tensor model, the MLP with failures chosen by the input.

Load it with `--plugins tests.support.faulty_models --models faulty`. It also registers `wide`, the MLP four
times as wide (a model that needs more memory per request than `mlp`). An item of `faulty` whose x[0] is
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

import torch

from server.config import Settings
from server.domain import Array
from server.runtimes.base import TensorModel
from server.runtimes.mlp import MlpModel
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


def _factory(settings: Settings, device: torch.device) -> FaultyModel:
    return FaultyModel(width=settings.mlp_width, max_batch_size=settings.max_batch_size, device=device)


def _wide(settings: Settings, device: torch.device) -> TensorModel:
    mlp = MlpModel(width=4 * settings.mlp_width, max_batch_size=settings.max_batch_size, device=device)
    mlp.descriptor = dataclasses.replace(mlp.descriptor, name="wide", description="A wider MLP (tests only)")
    return mlp


register_model("faulty", _factory)
register_model("wide", _wide)
