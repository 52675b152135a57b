"""Capacity from measurement: N derived from the budget and the measured per-request peak, with margin."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from server.config import Settings
from server.memory.capacity import kv_tokens, plan_capacity
from server.memory.probes import FakeProbe
from server.runtimes.mlp import MlpModel


def plan_for(tmp_path: Path, used_fraction: float, budget: int, **settings: object):  # type: ignore[no-untyped-def]
    level = tmp_path / "mem"
    level.write_text(str(used_fraction))
    model = MlpModel(width=2048, max_batch_size=32, device=torch.device("cpu"))
    with torch.inference_mode():
        return plan_capacity(model, Settings(**settings), FakeProbe(level, budget))  # type: ignore[arg-type]


def test_slots_follow_the_formula(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, 0.5, 64 * 2**20, capacity_margin=0.25)
    # Per item: input 2 KiB + three 8 KiB hidden layers (linear and GELU outputs) + 2 KiB output, x2 for GELU.
    assert 40 * 1024 <= plan.per_request_bytes <= 80 * 1024
    expected = int(plan.free_bytes / plan.per_request_bytes * 0.75)
    assert abs(plan.max_concurrency - expected) <= 1
    assert plan.free_bytes == 32 * 2**20
    assert "N = " in plan.explain()


def test_less_free_memory_means_fewer_slots_and_smaller_batches(tmp_path: Path) -> None:
    roomy = plan_for(tmp_path, 0.0, 64 * 2**20)
    tight = plan_for(tmp_path, 0.9995, 64 * 2**20)
    assert tight.max_concurrency < roomy.max_concurrency
    assert tight.max_batch_size < 32 <= roomy.max_batch_size
    assert tight.max_concurrency >= 1 and tight.max_batch_size >= 1


def test_weights_are_reported(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, 0.1, 2**30)
    params = 512 * 2048 + 2048 + 2 * (2048 * 2048 + 2048) + 2048 * 512 + 512
    assert plan.weights_bytes == params * 4


def test_kv_tokens_are_the_byte_budget_or_the_free_fraction_capped_on_cpu() -> None:
    from server.memory.capacity import CPU_KV_CACHE_BYTES
    from server.memory.probes import MemoryReading
    from server.runtimes.byte_lm import ByteLm

    model = ByteLm(size="tiny", context_length=512, max_sequences=64, device=torch.device("cpu"))
    per_token = model.kv_bytes_per_token()  # 2 (k, v) x 2 layers x 4 heads x 16 x 4 bytes
    assert per_token == 2 * 2 * 4 * 16 * 4
    roomy = MemoryReading(used_bytes=0, reserved_bytes=0, budget_bytes=1 << 40)
    tokens, why = kv_tokens(model, Settings(), 512, roomy)
    assert tokens == CPU_KV_CACHE_BYTES // per_token and why.startswith("the CPU default")
    assert kv_tokens(model, Settings(kv_cache_bytes=per_token * 5000), 512, roomy)[0] == 5000
    short = MemoryReading(used_bytes=2**20, reserved_bytes=0, budget_bytes=2**20 + 2000 * per_token)
    tokens, why = kv_tokens(model, Settings(kv_cache_memory=0.5), 512, short)
    assert tokens == 1000 and why.startswith("0.5 x free")
    full = MemoryReading(used_bytes=2**20, reserved_bytes=0, budget_bytes=2**20 + 100 * per_token)
    with pytest.raises(ValueError, match="invalid setting kv_cache_bytes"):
        kv_tokens(model, Settings(), 512, full)
