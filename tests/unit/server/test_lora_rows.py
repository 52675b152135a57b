"""Issue 32: a request's extras name its adapter and key the prefix cache by the adapter's load, and a
step's token rows group by adapter (the prefill chunks' tokens, then one row per decoding sequence)."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
import torch

from server.batching.extras import RequestExtras
from server.domain import GenerateSpec
from server.runtimes.lora import LoraAdapter
from server.runtimes.lora_graph import lora_delta
from server.runtimes.lora_stack import STACK_RANKS, LoraStacks
from server.runtimes.quantized import prepacks


def adapter(name: str) -> LoraAdapter:
    return LoraAdapter(name, f"/adapters/{name}", 4, ("q_proj",), [[torch.zeros(1)]])


def spec(model: str) -> GenerateSpec:
    return GenerateSpec(model=model, prompt_text="hi", prompt_ids=None)


def test_the_model_name_resolves_to_the_adapter_and_its_load_salts_the_cache() -> None:
    first, other = adapter("a"), adapter("b")
    model: Any = SimpleNamespace(adapters=MappingProxyType({"a": first, "b": other}))
    base = RequestExtras.of(spec("llama"), tenant_salt="tenant:x", model=model)
    a = RequestExtras.of(spec("a"), tenant_salt="tenant:x", model=model)
    b = RequestExtras.of(spec("b"), tenant_salt="tenant:x", model=model)
    assert base.adapter is None and base.salt == "tenant:x"
    assert a.adapter is first and b.adapter is other
    assert len({base.salt, a.salt, b.salt}) == 3 and a.salt.startswith("tenant:x")
    reloaded: Any = SimpleNamespace(adapters=MappingProxyType({"a": adapter("a")}))
    assert RequestExtras.of(spec("a"), tenant_salt="tenant:x", model=reloaded).salt != a.salt
    assert RequestExtras.of(spec("a"), tenant_salt="", model=None) == RequestExtras()


def projected(
    rank: int, seed: int, skip: tuple[int, ...] = (), dtype: torch.dtype = torch.float32
) -> LoraAdapter:
    """An adapter of 2 layers over projections of widths in -> out (8 -> 6, 6 -> 8, 8 -> 10, 10 -> 8,
    as PROJECTIONS), seeded, leaving the projections in `skip` alone."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(8, 6), (6, 8), (8, 10), (10, 8)]
    layers = []
    for _ in range(2):
        row: list[torch.Tensor] = []
        for p, (fan_in, fan_out) in enumerate(shapes):
            if p in skip:
                row += [torch.empty(0), torch.empty(0)]
            else:
                row += [
                    torch.randn(fan_in, rank, generator=generator),
                    torch.randn(rank, fan_out, generator=generator),
                ]
        layers.append(row)
    layers = [[t.to(dtype) for t in row] for row in layers]
    return LoraAdapter(f"r{rank}", "/adapters", rank, ("q_proj",), layers)


def test_banked_deltas_equal_each_rows_own_adapter() -> None:
    adapters = [projected(2, 1), projected(4, 2, skip=(1,)), projected(3, 3), projected(60, 4, skip=(0, 2))]
    row: Any = lambda found: SimpleNamespace(adapter=found)  # noqa: E731
    chunks = [3, 2]  # two prefill chunks: 5 tokens, then 7 decoding rows
    owners = [adapters[1], None, adapters[0], adapters[3], adapters[2], None, adapters[1]]
    stacks = LoraStacks(torch.float32, torch.device("cpu"))
    stacks.restack(adapters)
    weights, rows = stacks.segments(chunks, [row(adapters[0]), row(None)], [row(a) for a in owners])
    per_token = [adapters[0]] * 3 + [None] * 2 + owners
    # ranks 2 + 4 + 3 share one bank; the rank-60 adapter would take it past STACK_RANKS: its own weights
    assert len(rows) == 2 and adapters[3].rank + 9 > STACK_RANKS
    assert [r.tolist() for r in rows] == [[0, 1, 2, 5, 7, 9, 11], [8]]
    assert_deltas(weights, rows, per_token)
    full = [adapters[2], adapters[0], adapters[1], adapters[0]]  # every row adapted: no gather
    weights, rows = stacks.segments([], [], [row(a) for a in full])
    assert [r.tolist() for r in rows] == [[0, 1, 2, 3]]
    assert_deltas(weights, rows, full)
    # steps read the bank built at load; one adapter of a bank alone takes its own weights and no mask, as
    # does one loaded since (until restack), and an unloaded one whose sequences still run
    again, _ = stacks.segments([], [], [row(adapters[1]), row(adapters[0])])
    assert again[0][0][0] is weights[0][0][0]
    later = projected(4, 5)
    mixed = [adapters[0], later, adapters[2]]
    weights, rows = stacks.segments([], [], [row(a) for a in mixed])
    assert [r.tolist() for r in rows] == [[0, 2], [1]] and weights[1][0][0] is later.layers[0][0]
    assert_deltas(weights, rows, mixed)
    stacks.restack([adapters[0], later])
    weights, rows = stacks.segments([], [], [row(a) for a in mixed])
    assert [r.tolist() for r in rows] == [[0, 1], [2]] and weights[1][0][0] is adapters[2].layers[0][0]
    assert_deltas(weights, rows, mixed)
    alone, alone_rows = stacks.segments([], [], [row(None), row(adapters[0])])
    assert alone[0][0][0] is adapters[0].layers[0][0] and alone[0][0][8].numel() == 0
    assert alone_rows[0].tolist() == [1]
    assert stacks.segments([2], [], [row(None)]) == ([], [])


def test_a_bfloat16_bank_is_prepacked_and_adds_the_same_deltas() -> None:
    if not prepacks(torch.bfloat16, torch.device("cpu")):
        pytest.skip("this CPU has no oneDNN bfloat16 matmuls: banks stay dense")
    adapters = [projected(2, 1, dtype=torch.bfloat16), projected(8, 2, (3,), dtype=torch.bfloat16)]
    stacks = LoraStacks(torch.bfloat16, torch.device("cpu"))
    stacks.restack(adapters)
    per_token = [adapters[0], None, adapters[1], adapters[1], None]
    row: Any = lambda found: SimpleNamespace(adapter=found)  # noqa: E731
    weights, rows = stacks.segments([], [], [row(a) for a in per_token])
    assert weights[0][0][0].is_mkldnn and weights[0][0][1].is_mkldnn
    assert_deltas(weights, rows, per_token)
    everyone = [adapters[1], adapters[0]]
    weights, rows = stacks.segments([], [], [row(a) for a in everyone])
    assert_deltas(weights, rows, everyone)


def assert_deltas(weights: Any, rows: Any, per_token: list[LoraAdapter | None]) -> None:
    """lora_delta over the stacks adds each token row its own adapter's x @ A @ B (as float32 computes it
    from the same values; bfloat16's rounding allowed where the adapters are bfloat16), and nothing to the
    base model's rows, in every layer and projection."""
    generator = torch.Generator().manual_seed(0)
    dtype = next(a for a in per_token if a is not None).layers[0][0].dtype
    for layer in range(2):
        for p, (fan_in, fan_out) in enumerate([(8, 6), (6, 8), (8, 10), (10, 8)]):
            x = torch.randn(len(per_token), fan_in, generator=generator).to(dtype)
            y = torch.randn(len(per_token), fan_out, generator=generator).to(dtype)
            expected = y.to(torch.float32, copy=True)
            for t, adapter in enumerate(per_token):
                a = adapter.layers[layer][2 * p] if adapter is not None else torch.empty(0)
                if adapter is not None and a.numel() > 0:
                    expected[t] += x[t].float() @ a.float() @ adapter.layers[layer][2 * p + 1].float()
            got = lora_delta(x, y.clone(), weights, rows, layer, 2 * p)
            loose = dtype == torch.bfloat16
            torch.testing.assert_close(
                got.float(), expected, rtol=0.03 if loose else 1e-5, atol=0.3 if loose else 1e-5
            )
            base = [t for t, adapter in enumerate(per_token) if adapter is None]
            assert torch.equal(got[base], y[base])  # the base model's rows: untouched, bit for bit
