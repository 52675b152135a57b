"""The CUDA paths: device memory probe and breaker, capacity from torch.cuda.max_memory_allocated, OOM
recovery in the batcher, and the server serving both RPCs on the GPU. Run by scripts/cuda_check.sh."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from clients import SluiceClient
from server.batching.dynamic import DynamicBatcher
from server.batching.worker import ModelWorker
from server.config import Settings
from server.domain import InferItem
from server.errors import OutOfMemory
from server.memory.breaker import MemoryBreaker
from server.memory.capacity import plan_capacity
from server.memory.probes import CudaProbe, make_probe
from server.metrics import Metrics
from server.runtimes.mlp import MlpModel
from tests.support.processes import start_server

pytestmark = pytest.mark.cuda
GPU = torch.device("cuda")


def test_cuda_probe_sees_an_allocation() -> None:
    probe = CudaProbe(GPU)
    before = probe.read()
    block = torch.empty(512 * 2**20, dtype=torch.uint8, device=GPU)
    after = probe.read()
    print(
        f"\nCUDA probe: used {before.used_bytes / 2**30:.2f} -> {after.used_bytes / 2**30:.2f} GiB "
        f"of {after.budget_bytes / 2**30:.1f} GiB"
    )
    assert after.used_bytes - before.used_bytes >= 500 * 2**20
    del block
    assert make_probe("auto", GPU, 0).name == "cuda"


def test_breaker_opens_on_device_memory_and_closes_after_release() -> None:
    probe = CudaProbe(GPU)
    used = probe.read().used_bytes
    # A budget just above what is in use now: a 1 GiB block crosses the high watermark.
    probe = CudaProbe(GPU, budget_bytes=used + 2**30)
    breaker = MemoryBreaker(probe, high=0.9, low=0.5, interval_s=0.01)
    breaker.sample()
    was_open = breaker.is_open
    block = torch.empty(2**30, dtype=torch.uint8, device=GPU)
    breaker.sample()
    assert breaker.is_open
    del block
    torch.cuda.empty_cache()
    breaker.sample()
    print(f"\nCUDA breaker: open before={was_open}, at +1 GiB=True, after release={breaker.is_open}")
    assert not breaker.is_open


def test_capacity_is_measured_with_max_memory_allocated() -> None:
    model = MlpModel(width=2048, max_batch_size=32, device=GPU)
    worker = ModelWorker("cuda-capacity")
    try:
        plan = worker.call(plan_capacity, model, Settings(device="cuda"), CudaProbe(GPU))
    finally:
        worker.shutdown()
    print(f"\nCUDA capacity: {plan.explain()}")
    assert plan.method == "torch.cuda.max_memory_allocated"
    assert 2048 * 4 <= plan.per_request_bytes < 64 * 2**20
    assert plan.max_concurrency >= 1


class _Hungry(MlpModel):
    """Asks for more device memory than exists when the batch is larger than one item."""

    def forward(self, batch):  # type: ignore[no-untyped-def]
        if len(batch) > 1:
            too_much = int(1.5 * torch.cuda.get_device_properties(GPU).total_memory)
            torch.empty(too_much, dtype=torch.uint8, device=GPU)
        return super().forward(batch)


def test_a_real_cuda_oom_splits_the_batch_and_trips_the_breaker() -> None:
    async def main() -> tuple[list[object], bool]:
        model = _Hungry(width=256, max_batch_size=8, device=GPU)
        breaker = MemoryBreaker(CudaProbe(GPU), high=0.99, low=0.98, interval_s=1)
        worker = ModelWorker("cuda-oom")
        batcher = DynamicBatcher(
            model, worker, max_batch_size=4, max_delay_s=0.05, breaker=breaker, metrics=Metrics()
        )
        task = asyncio.create_task(batcher.run())
        items = [InferItem("mlp", {"x": np.full(512, i, dtype=np.float32)}) for i in range(4)]
        calls = (batcher.submit(item, None) for item in items)
        results = await asyncio.gather(*calls, return_exceptions=True)
        task.cancel()
        worker.shutdown()
        return results, breaker.is_open

    results, opened = asyncio.run(main())
    print(
        f"\nCUDA OOM: {sum(not isinstance(r, Exception) for r in results)}/4 answered after splitting; "
        f"breaker opened={opened}"
    )
    assert not any(isinstance(r, OutOfMemory) for r in results)
    assert all(not isinstance(r, Exception) for r in results)
    assert opened


def test_server_serves_infer_and_generate_on_the_gpu() -> None:
    # Not the default models: the embedding model's files (88 MB) do not travel to a lent GPU machine.
    server = start_server("--device", "cuda", "--lm-size", "small", "--models", "mlp,byte-lm")
    try:
        with SluiceClient(server.target) as client:
            assert all(m.device.startswith("cuda") for m in client.list_models())
            y = client.infer("mlp", {"x": np.ones(512, np.float32)}).outputs["y"]
            chunks = list(client.generate("byte-lm", "GPU", max_tokens=32, seed=1))
        assert y.shape == (512,)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 32
        used = server.metric("sluice_memory_used_bytes") / 2**30
        print(f"\nCUDA server: memory used {used:.2f} GiB (probe cuda)")
        assert server.metric("sluice_memory_used_bytes", probe="cuda") > 0
    finally:
        assert server.terminate() == 0
