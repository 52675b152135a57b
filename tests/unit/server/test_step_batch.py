"""The step object (issue 35, item 5): the scheduler hands the runtime one StepBatch per step, its rows'
request extras beside the prefill chunks and decoding rows, so a per-row input reaches the model's forward
through GenerativeModel.step without any runtime's signature changing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from server.batching.continuous import ContinuousScheduler
from server.batching.extras import RequestExtras
from server.batching.requests import RequestLimits
from server.batching.worker import ModelWorker
from server.domain import GenerateSpec
from server.metrics import Metrics
from server.runtimes.byte_lm import ByteLm
from server.runtimes.step_batch import RowExtras, StepBatch
from wire.sampling import Sampling


def salt(extras: RowExtras) -> str:
    assert isinstance(extras, RequestExtras)  # the scheduler hands the sequence's own extras
    return extras.salt


class ExtrasLm(ByteLm):
    """The real byte LM, recording which request's extras each prefill chunk and decoding row came with."""

    def __init__(self) -> None:
        super().__init__(size="tiny", context_length=128, max_sequences=4, device=torch.device("cpu"))
        self.prefilled: list[tuple[int, str]] = []  # (region base, salt)
        self.decoded: list[list[tuple[int, str]]] = []  # per decode step: (region base, salt) per row

    def step(self, batch: StepBatch, *, computing: Callable[[], None] = lambda: None) -> torch.Tensor:
        assert len(batch.prefill_extras) == len(batch.prefills) and len(batch.decode_extras) == len(
            batch.bases
        )
        self.prefilled += [
            (p.base, salt(e)) for p, e in zip(batch.prefills, batch.prefill_extras, strict=True)
        ]
        if batch.bases:
            self.decoded.append([(b, salt(e)) for b, e in zip(batch.bases, batch.decode_extras, strict=True)])
        return super().step(batch, computing=computing)


def test_each_row_of_a_step_carries_its_own_requests_extras_to_the_model() -> None:
    model, worker = ExtrasLm(), ModelWorker("test")
    worker.call(model.allocate_cache, 4 * 128)
    scheduler = ContinuousScheduler(
        model, worker, kv_tokens=4 * 128, prefix_cache=False,
        limits=RequestLimits(context_length=128, default_max_tokens=16), stream_buffer=64,
        stall_timeout_s=30.0, breaker=None, metrics=Metrics(),
    )  # fmt: skip

    def spec(prompt: str) -> GenerateSpec:
        sampling = Sampling.of({"max_tokens": 6, "temperature": 0.0})
        return GenerateSpec(model="byte-lm", prompt_text=prompt, prompt_ids=None, sampling=sampling)

    async def main() -> None:
        task = asyncio.create_task(scheduler.run())
        try:
            first = scheduler.submit(spec("a first prompt"), extras=RequestExtras(salt="tenant-a"))
            second = scheduler.submit(spec("another"), extras=RequestExtras(salt="tenant-b"))
            for seq in (first, second):
                _ = [chunk async for chunk in scheduler.chunks(seq)]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            worker.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))
    salts = dict(model.prefilled)
    assert sorted(salts.values()) == ["tenant-a", "tenant-b"]
    assert model.decoded and all(salts[base] == salt for row in model.decoded for base, salt in row)
    assert any(len(row) == 2 for row in model.decoded)  # both decoded in one step, each with its own
