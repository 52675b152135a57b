"""ComputeInterval: the GIL switch interval while Infer batches compute, counted across batchers and
threads, and the DynamicBatcher's forward pass run inside it."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pytest
import torch

from server.batching.dynamic import DynamicBatcher
from server.batching.switch_interval import ComputeInterval
from server.batching.worker import ModelWorker
from server.domain import Array, InferItem
from server.metrics import Metrics
from server.runtimes.base import TensorModel
from server.runtimes.mlp import MlpModel

OUTSIDE_S = 0.0002  # CPython keeps whole microseconds: compared to within one
DURING_S = 0.00003


@pytest.fixture(autouse=True)
def known_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(OUTSIDE_S)
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_short_inside_and_put_back_after() -> None:
    with ComputeInterval(DURING_S):
        assert sys.getswitchinterval() == pytest.approx(DURING_S, abs=1e-6)
    assert sys.getswitchinterval() == pytest.approx(OUTSIDE_S, abs=1e-6)


def test_the_interval_is_put_back_when_the_forward_raises() -> None:
    with pytest.raises(RuntimeError), ComputeInterval(DURING_S):
        raise RuntimeError("the model failed")
    assert sys.getswitchinterval() == pytest.approx(OUTSIDE_S, abs=1e-6)


def test_overlapping_windows_of_two_threads_restore_only_when_the_last_closes() -> None:
    first_in, second_in, first_out, second_may_leave = (threading.Event() for _ in range(4))
    seen: dict[str, float] = {}

    def first() -> None:
        with ComputeInterval(DURING_S):
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with ComputeInterval(DURING_S):
            second_in.set()
            first_out.wait(10)
            seen["after the first left"] = sys.getswitchinterval()
            second_may_leave.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_out.wait(10)
    second_may_leave.set()
    for thread in threads:
        thread.join(10)
    # The second batch still computes when the first has left.
    assert seen["after the first left"] == pytest.approx(DURING_S, abs=1e-6)
    assert sys.getswitchinterval() == pytest.approx(OUTSIDE_S, abs=1e-6)


def test_a_non_positive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ComputeInterval(0.0)


class IntervalModel(TensorModel):
    """The MLP, noting the switch interval each forward pass ran under."""

    def __init__(self) -> None:
        self.mlp = MlpModel(width=16, max_batch_size=4, device=torch.device("cpu"))
        self.descriptor = self.mlp.descriptor
        self.intervals: list[float] = []

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        self.intervals.append(sys.getswitchinterval())
        return self.mlp.forward(batch)


@pytest.mark.parametrize("during_s", [DURING_S, None])
def test_the_batcher_computes_under_the_interval_it_was_given(during_s: float | None) -> None:
    model = IntervalModel()

    async def main() -> None:
        worker = ModelWorker("interval")
        batcher = DynamicBatcher(
            model,
            worker,
            max_batch_size=4,
            max_delay_s=0.0,
            breaker=None,
            metrics=Metrics(),
            switch_interval_s=during_s,
        )
        loop = asyncio.create_task(batcher.run())
        try:
            x = np.ones(512, dtype=np.float32)
            result = await batcher.submit(InferItem(model="mlp", inputs={"x": x}), None)
            assert result.outputs["y"].shape == (512,)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await asyncio.to_thread(worker.shutdown)

    asyncio.run(main())
    assert model.intervals == [pytest.approx(during_s or OUTSIDE_S, abs=1e-6)]
    assert sys.getswitchinterval() == pytest.approx(OUTSIDE_S, abs=1e-6)
