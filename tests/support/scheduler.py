"""The continuous scheduler over the real byte LM (or a model the test loaded), in-process, for unit tests of
KV memory: one worker and one scheduler per run, the test's body awaited under a deadline, then everything
shut down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch

from server.batching.continuous import ContinuousScheduler
from server.batching.requests import RequestLimits
from server.batching.sequence import GenSequence
from server.batching.worker import ModelWorker
from server.domain import GenerateSpec
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel
from server.runtimes.byte_lm import ByteLm
from wire.sampling import Sampling


def run_scheduler(
    body: Callable[[ContinuousScheduler], Awaitable[None]],
    *,
    kv_tokens: int,
    context: int,
    max_sequences: int,
    timeout_s: float,
    model: GenerativeModel | None = None,
    **options: object,
) -> Metrics:
    """Runs `body` against a scheduler of `kv_tokens` over `model` (None: a tiny byte LM; a model is given a
    fresh cache of `kv_tokens`); `options` are the scheduler's (prefill_chunk_tokens, prefix_sharing,
    stall_timeout_s, ...). Returns the scheduler's metrics."""
    if model is None:
        model = ByteLm(
            size="tiny", context_length=context, max_sequences=max_sequences, device=torch.device("cpu")
        )
    worker = ModelWorker("test")
    worker.call(model.allocate_cache, kv_tokens)
    metrics = Metrics()
    settings: dict[str, object] = {"prefix_cache": True, "stream_buffer": 1024, "breaker": None, **options}
    scheduler = ContinuousScheduler(
        model, worker, kv_tokens=kv_tokens, limits=RequestLimits(context_length=context), metrics=metrics,
        **settings,  # type: ignore[arg-type]
    )  # fmt: skip

    async def main() -> None:
        task = asyncio.create_task(scheduler.run())
        try:
            await asyncio.wait_for(body(scheduler), timeout_s)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            worker.shutdown()

    asyncio.run(main())
    return metrics


def submit(scheduler: ContinuousScheduler, prompt: str, **sampling: object) -> GenSequence:
    """A byte-lm Generate of `prompt` with `sampling` (wire names), submitted to `scheduler`."""
    spec = GenerateSpec(model="byte-lm", prompt_text=prompt, prompt_ids=None, sampling=Sampling.of(sampling))
    return scheduler.submit(spec)
