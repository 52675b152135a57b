"""DynamicBatcher with a real MLP on its ModelWorker thread: batch forming, max_delay, cancellation,
deadlines, per-item failure isolation, out-of-memory splitting and the breaker, buckets."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from server.batching.dynamic import DynamicBatcher
from server.batching.worker import ModelWorker
from server.codec.status import grpc_code
from server.domain import Array, DType, InferItem, InferResult, TensorSpec
from server.errors import DeadlineExpired, ModelFailure, OutOfMemory
from server.memory.breaker import MemoryBreaker
from server.memory.probes import FakeProbe
from server.metrics import Metrics
from server.runtimes.base import TensorModel
from server.runtimes.mlp import MlpModel

MAX_BATCH = 8
FEATURES = 512


class RecordingModel(TensorModel):
    """The MLP, recording every batch it is asked to compute (by x[0], each item's id in these tests).

    `hold` blocks forward until set, so a test can queue items behind a running batch; NaN in x[0] raises
    ValueError and a batch larger than `oom_above` (or holding x[0] == -1) raises torch.OutOfMemoryError.
    """

    def __init__(self, *, oom_above: int | None = None) -> None:
        self.mlp = MlpModel(width=64, max_batch_size=MAX_BATCH, device=torch.device("cpu"))
        self.descriptor = self.mlp.descriptor
        self.batches: list[list[float]] = []
        self.entered = threading.Event()
        self.hold = threading.Event()
        self.hold.set()
        self.oom_above = oom_above

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        heads = [float(item["x"][0]) for item in batch]
        self.batches.append(heads)
        self.entered.set()
        self.hold.wait(10)
        if any(np.isnan(heads)):
            raise ValueError("x[0] is NaN")
        if -1.0 in heads or (self.oom_above is not None and len(batch) > self.oom_above):
            raise torch.OutOfMemoryError("simulated out of memory")
        return self.mlp.forward(batch)

    def expected(self, x: Array) -> Array:
        with torch.inference_mode():
            return self.mlp.net(torch.from_numpy(x)[None]).numpy()[0]


class LengthModel(TensorModel):
    """Variable-length input `x` [-1]; its bucket is the length, so a batch never mixes lengths."""

    def __init__(self) -> None:
        self.descriptor = dataclasses.replace(
            MlpModel(width=8, max_batch_size=MAX_BATCH, device=torch.device("cpu")).descriptor,
            name="lengths",
            inputs=(TensorSpec("x", DType.FLOAT32, (-1,)),),
            outputs=(TensorSpec("y", DType.FLOAT32, (-1,)),),
        )
        self.batches: list[list[int]] = []

    def bucket(self, inputs: Mapping[str, Array]) -> Hashable:
        return inputs["x"].shape[0]

    def forward(self, batch: Sequence[Mapping[str, Array]]) -> list[dict[str, Array]]:
        self.batches.append([item["x"].shape[0] for item in batch])
        x = torch.from_numpy(np.stack([item["x"] for item in batch]))
        return [{"y": row} for row in (x * 2).numpy()]


def item(ident: float, *, features: int = FEATURES) -> InferItem:
    x = np.random.default_rng(int(abs(ident)) if np.isfinite(ident) else 7).standard_normal(features)
    x = x.astype(np.float32)
    x[0] = ident
    return InferItem(model="mlp", inputs={"x": x})


Scenario = Callable[[DynamicBatcher], Awaitable[None]]


def drive(
    model: TensorModel, scenario: Scenario, *, max_delay_s: float = 10.0, breaker: MemoryBreaker | None = None
) -> None:
    """Runs the batcher's loop and `scenario` on one event loop, and stops both cleanly."""

    async def main() -> None:
        worker = ModelWorker("test")
        batcher = DynamicBatcher(
            model,
            worker,
            max_batch_size=MAX_BATCH,
            max_delay_s=max_delay_s,
            breaker=breaker,
            metrics=Metrics(),
        )
        loop = asyncio.create_task(batcher.run())
        try:
            await scenario(batcher)
            assert not loop.done(), "the batcher loop must survive everything a scenario does"
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await asyncio.to_thread(worker.shutdown)

    asyncio.run(main())


async def until(predicate: Callable[[], bool], what: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def running_batch(model: RecordingModel, batcher: DynamicBatcher) -> asyncio.Task[InferResult]:
    """Starts a batch of one that blocks inside forward until `model.hold` is set."""
    model.hold.clear()
    blocker = asyncio.create_task(batcher.submit(item(1000), None))
    await asyncio.to_thread(model.entered.wait, 10)
    return blocker


def test_batches_fill_up_to_max_batch_size() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        items = [item(i) for i in range(2 * MAX_BATCH)]
        results = await asyncio.gather(*(batcher.submit(it, None) for it in items))
        # max_delay is 10 s: only full batches can have fired within the test.
        assert [len(b) for b in model.batches] == [MAX_BATCH, MAX_BATCH]
        assert sorted(h for b in model.batches for h in b) == list(range(2 * MAX_BATCH))
        for it, result in zip(items, results, strict=True):
            np.testing.assert_allclose(
                result.outputs["y"], model.expected(it.inputs["x"]), rtol=1e-4, atol=1e-6
            )
            assert result.batch_size == MAX_BATCH

    drive(model, scenario)


def test_a_lone_item_fires_after_max_delay() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        start = time.monotonic()
        result = await batcher.submit(item(1), None)
        assert time.monotonic() - start >= 0.05
        assert model.batches == [[1.0]] and result.batch_size == 1

    drive(model, scenario, max_delay_s=0.05)


def test_items_cancelled_while_queued_are_never_computed() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        blocker = await running_batch(model, batcher)
        tasks = {i: asyncio.create_task(batcher.submit(item(i), None)) for i in range(6)}
        await until(lambda: batcher.pending == 6, "six queued items")
        for i in (1, 3, 4):
            tasks[i].cancel()
        model.hold.set()
        await blocker
        for i in (0, 2, 5):
            assert (await tasks[i]).outputs["y"].shape == (FEATURES,)
        for i in (1, 3, 4):
            with pytest.raises(asyncio.CancelledError):
                await tasks[i]
        assert model.batches == [[1000.0], [0.0, 2.0, 5.0]]
        assert batcher.items_computed == 4 and batcher.pending == 0

    drive(model, scenario, max_delay_s=0.0)


def test_an_item_whose_deadline_passed_while_queued_is_expired_not_computed() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        blocker = await running_batch(model, batcher)
        deadline = time.monotonic() + 0.02
        late = asyncio.create_task(batcher.submit(item(1), deadline))
        on_time = asyncio.create_task(batcher.submit(item(2), time.monotonic() + 60))
        await until(lambda: time.monotonic() > deadline, "the deadline to pass")
        model.hold.set()
        await blocker
        with pytest.raises(DeadlineExpired):
            await late
        assert (await on_time).batch_size == 1
        assert model.batches == [[1000.0], [2.0]]

    drive(model, scenario, max_delay_s=0.0)


def test_a_full_batch_is_handed_over_behind_the_running_one_and_drops_what_left_meanwhile() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        blocker = await running_batch(model, batcher)
        soon = time.monotonic() + 0.05
        tasks = {
            i: asyncio.create_task(batcher.submit(item(i), soon if i == 6 else None))
            for i in range(MAX_BATCH)
        }
        # Full: handed to the worker at once (its queue, behind the blocked batch), not kept in the batcher.
        await until(lambda: batcher.pending == 0, "the full batch to be handed over")
        tasks[2].cancel()
        await until(lambda: time.monotonic() > soon, "item 6's deadline to pass")
        model.hold.set()
        await blocker
        with pytest.raises(asyncio.CancelledError):
            await tasks[2]
        with pytest.raises(DeadlineExpired):
            await tasks[6]
        kept = [i for i in range(MAX_BATCH) if i not in (2, 6)]
        for i in kept:
            assert (await tasks[i]).batch_size == len(kept)
        assert model.batches == [[1000.0], [float(i) for i in kept]]

    drive(model, scenario, max_delay_s=0.0)


def test_a_partial_batch_waits_for_the_running_one_instead_of_queueing_behind_it() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        blocker = await running_batch(model, batcher)
        first = [asyncio.create_task(batcher.submit(item(i), None)) for i in range(3)]
        await until(lambda: batcher.pending == 3, "three queued items")
        later = [asyncio.create_task(batcher.submit(item(i), None)) for i in range(3, 5)]
        await until(lambda: batcher.pending == 5, "five queued items")
        model.hold.set()
        await asyncio.gather(blocker, *first, *later)
        # max_delay is 0, yet the five left together: nothing partial was pushed behind the running batch.
        assert model.batches == [[1000.0], [0.0, 1.0, 2.0, 3.0, 4.0]]

    drive(model, scenario, max_delay_s=0.0)


def test_a_failing_item_fails_alone_and_its_batch_mates_get_their_results() -> None:
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        items = [item(i) for i in range(MAX_BATCH)]
        items[5] = item(float("nan"))
        outcomes = await asyncio.gather(*(batcher.submit(it, None) for it in items), return_exceptions=True)
        assert isinstance(outcomes[5], ModelFailure)
        assert "ValueError" in str(outcomes[5]) and grpc_code(outcomes[5]).name == "INTERNAL"
        for i, (it, outcome) in enumerate(zip(items, outcomes, strict=True)):
            if i != 5:
                assert isinstance(outcome, InferResult), outcome
                np.testing.assert_allclose(
                    outcome.outputs["y"], model.expected(it.inputs["x"]), rtol=1e-4, atol=1e-6
                )
        assert len(model.batches[0]) == MAX_BATCH  # it was one batch, split after it failed

    drive(model, scenario)


def test_out_of_memory_splits_the_batch_in_halves_and_trips_the_breaker(tmp_path: Path) -> None:
    model = RecordingModel(oom_above=2)
    breaker = MemoryBreaker(FakeProbe(tmp_path / "memory"), high=0.9, low=0.7, interval_s=0.01)

    async def scenario(batcher: DynamicBatcher) -> None:
        assert not breaker.is_open
        items = [item(i) for i in range(MAX_BATCH)]
        results = await asyncio.gather(*(batcher.submit(it, None) for it in items))
        assert [len(b) for b in model.batches] == [8, 4, 2, 2, 4, 2, 2]  # depth first
        for it, result in zip(items, results, strict=True):
            np.testing.assert_allclose(
                result.outputs["y"], model.expected(it.inputs["x"]), rtol=1e-4, atol=1e-6
            )
        assert breaker.is_open and breaker.trips == 3  # the batch of 8 and both halves of 4 ran out
        breaker.sample()  # the probe reads 0% used: the next sample closes it
        assert not breaker.is_open

    drive(model, scenario, breaker=breaker)


def test_an_item_that_runs_out_of_memory_alone_gets_resource_exhausted(tmp_path: Path) -> None:
    model = RecordingModel()
    breaker = MemoryBreaker(FakeProbe(tmp_path / "memory"), high=0.9, low=0.7, interval_s=0.01)

    async def scenario(batcher: DynamicBatcher) -> None:
        items = [item(i) for i in range(4)] + [item(-1)]
        outcomes = await asyncio.gather(*(batcher.submit(it, None) for it in items), return_exceptions=True)
        assert isinstance(outcomes[-1], OutOfMemory)
        assert grpc_code(outcomes[-1]).name == "RESOURCE_EXHAUSTED" and outcomes[-1].retry_after_s
        assert all(isinstance(o, InferResult) for o in outcomes[:-1]), outcomes
        assert breaker.is_open

    drive(model, scenario, max_delay_s=0.05, breaker=breaker)


def test_variable_length_items_are_batched_by_bucket() -> None:
    model = LengthModel()
    lengths = [3, 5, 3, 7, 5, 3, 7, 7, 5, 3, 3, 5]

    async def scenario(batcher: DynamicBatcher) -> None:
        xs = [np.arange(n, dtype=np.float32) + i for i, n in enumerate(lengths)]
        results = await asyncio.gather(
            *(batcher.submit(InferItem(model="v", inputs={"x": x}), None) for x in xs)
        )
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result.outputs["y"], x * 2)
        assert all(len(set(batch)) == 1 for batch in model.batches), model.batches
        assert sorted(n for batch in model.batches for n in batch) == sorted(lengths)
        assert len(model.batches) == 3  # one batch per length: the delay gathered each bucket whole

    drive(model, scenario, max_delay_s=0.05)


def test_items_queued_behind_a_running_batch_wake_the_dispatcher_only_when_they_can_go() -> None:
    """An item that can neither start a batch nor fill one changes no decision: the dispatcher is not run for
    it (a pass per call was a task step per call on the event loop), yet the full batch goes at once and the
    rest goes when the running batch ends."""
    model = RecordingModel()

    async def scenario(batcher: DynamicBatcher) -> None:
        passes = 0
        dispatch = batcher._dispatch_ready

        async def counted() -> None:
            nonlocal passes
            passes += 1
            await dispatch()

        batcher._dispatch_ready = counted  # type: ignore[method-assign]
        blocker = await running_batch(model, batcher)
        tasks = []
        for i in range(2 * MAX_BATCH + 3):  # one by one, as calls arrive, with loop turns between them
            tasks.append(asyncio.create_task(batcher.submit(item(i), None)))
            for _ in range(3):
                await asyncio.sleep(0)
        await until(
            lambda: batcher.pending == MAX_BATCH + 3, "a full batch handed over behind the running one"
        )
        await asyncio.sleep(0.05)  # time for any pass still due
        # The lone blocker; then the first item and the one that fills a batch, twice (the second full batch
        # waits: two are handed over already); none for the three past it.
        assert passes <= 5, f"{passes} dispatcher passes for {2 * MAX_BATCH + 4} items"
        model.hold.set()
        await blocker
        await asyncio.gather(*tasks)
        assert [len(b) for b in model.batches] == [1, MAX_BATCH, MAX_BATCH, 3]

    drive(model, scenario, max_delay_s=0.0)
