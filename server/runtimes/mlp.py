"""The embedded tensor model: a seeded MLP (512 -> 2048 -> 2048 -> 2048 -> 512, Linear+GELU) for Infer, and
its options (`--model-options mlp.width=256`)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from process.flags import setting
from server.domain import Array, DType, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.runtimes.base import TensorModel
from server.runtimes.options import ModelContext


@dataclass(frozen=True, slots=True, kw_only=True)
class MlpOptions:
    """`--model-options mlp.KEY=VALUE`."""

    width: int = setting(2048, help="hidden width of the embedded MLP", unit="units")

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError("width must be >= 1")


def build_mlp(width: int, *, features: int = 512, seed: int = 0) -> nn.Sequential:
    """The benchmark MLP: four Linear+GELU layers, float32, weights fixed by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    dims = [features, width, width, width, features]
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(dims):
        linear = nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            bound = 1.0 / fan_in**0.5
            linear.weight.uniform_(-bound, bound, generator=generator)
            linear.bias.uniform_(-bound, bound, generator=generator)
        layers += [linear, nn.GELU()]
    return nn.Sequential(*layers).eval()


def traced(net: nn.Module, example: torch.Tensor) -> nn.Module:
    """The module as a TorchScript trace, which runs the whole forward in C++ with the GIL released once.

    Eager PyTorch releases and re-takes the GIL around each of the eight ops, and each re-take waits for
    the busy event loop: under load that doubled the batch-32 forward (bench/admission.py). Same outputs,
    bit for bit, at any batch size. TorchScript is deprecated (hence the silenced warning) but still the one
    in-process way to run a graph without the GIL.
    """
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)
        # check_trace off: it re-runs the trace to compare it with the eager module through torch.testing,
        # whose import (torch.distributed.tensor) costs 0.6 CPU-s a start; an MLP has no data-dependent
        # control flow to get wrong, and tests/unit compares the two outputs.
        module: nn.Module = torch.jit.trace(net, example, check_trace=False)  # type: ignore[no-untyped-call]
    return module


class MlpModel(TensorModel):
    """Input `x` FLOAT32 [512] per item, output `y` FLOAT32 [512]."""

    def __init__(self, *, width: int, max_batch_size: int, device: torch.device, features: int = 512) -> None:
        self.device = device
        self.net = traced(
            build_mlp(width, features=features).to(device), torch.zeros(2, features, device=device)
        )
        self.descriptor = ModelDescriptor(
            name="mlp",
            version="1",
            kind=ModelKind.TENSOR,
            description=f"Seeded MLP {features}->{width}x3->{features} with GELU (float32)",
            limits=ModelLimits(max_batch_size=max_batch_size),
            device=str(device),
            inputs=(TensorSpec("x", DType.FLOAT32, (features,)),),
            outputs=(TensorSpec("y", DType.FLOAT32, (features,)),),
        )

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        stacked = torch.from_numpy(np.stack([item["x"] for item in batch]))
        if self.device.type == "cpu":  # every torch call is a GIL round trip: skip the no-op copies
            out = self.net(stacked).numpy()
        else:
            out = self.net(stacked.to(self.device, non_blocking=True)).cpu().numpy()
        return [{"y": row} for row in out]


def mlp_model(options: MlpOptions, context: ModelContext) -> MlpModel:
    return MlpModel(width=options.width, max_batch_size=context.max_batch_size, device=context.device)
