"""A plugin model that does no work: `noop` answers its FLOAT32 [512] input `x` as `y`, so what a benchmark
measures is Sluice's own per-call cost (front ends, admission, batching, codec) and nothing of torch.

    python -m server --plugins bench.noop_model --models noop
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from server.domain import Array, DType, ModelDescriptor, ModelKind, ModelLimits, TensorSpec
from server.runtimes.base import TensorModel
from server.runtimes.options import ModelContext
from server.runtimes.registry import register_model

FEATURES = 512


class NoopModel(TensorModel):
    def __init__(self, *, max_batch_size: int) -> None:
        self.descriptor = ModelDescriptor(
            name="noop",
            version="1",
            kind=ModelKind.TENSOR,
            description="Answers its input unchanged (benchmarks of the framework alone)",
            limits=ModelLimits(max_batch_size=max_batch_size),
            device="cpu",
            inputs=(TensorSpec("x", DType.FLOAT32, (FEATURES,)),),
            outputs=(TensorSpec("y", DType.FLOAT32, (FEATURES,)),),
        )

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        return [{"y": item["x"]} for item in batch]


def _factory(context: ModelContext) -> NoopModel:
    return NoopModel(max_batch_size=context.max_batch_size)


register_model("noop", _factory)
