"""Issue 32: a request's extras name its adapter and key the prefix cache by the adapter's load, and a
step's token rows group by adapter (the prefill chunks' tokens, then one row per decoding sequence)."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from server.batching.extras import RequestExtras
from server.domain import GenerateSpec
from server.runtimes.lora import LoraAdapter, segments


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


def test_rows_group_by_adapter_across_prefill_chunks_and_decoding_rows() -> None:
    a, b = adapter("a"), adapter("b")
    row: Any = lambda found: SimpleNamespace(adapter=found)  # noqa: E731
    weights, rows = segments([3, 2], [row(a), row(None)], [row(None), row(b), row(a)], torch.device("cpu"))
    assert weights == [a.layers, b.layers]
    assert [r.tolist() for r in rows] == [[0, 1, 2, 7], [6]]
    assert segments([2], [], [row(None)], torch.device("cpu")) == ([], [])
