"""sluice_lora_requests_info: which LoRA adapters each generative model is running and has waiting, and how
many it may hold loaded (vLLM's `vllm:lora_requests_info`, which the Gateway API Inference Extension reads
to route a request to a replica that has its adapter). Collected when /metrics is scraped, from the
schedulers' sequences: the step's path pays nothing for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LABELS = ["model", "running_lora_adapters", "waiting_lora_adapters", "max_lora"]


class LoraInfo(Collector):
    def __init__(self, schedulers: Callable[[], Mapping[str, Sequence[Any]]], max_loras: int) -> None:
        self.schedulers, self.max_loras = schedulers, max_loras

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "sluice_lora_requests_info",
            "LoRA adapters running and waiting per model (vLLM's).",
            labels=LABELS,
        )
        seen = set()
        for replicas in list(self.schedulers().values()):
            for scheduler in replicas:
                if id(scheduler) in seen or not scheduler.model.adapters:
                    continue
                seen.add(id(scheduler))
                running = _names(list(scheduler.active))
                waiting = _names(list(scheduler.joining))
                name = scheduler.model.descriptor.name
                family.add_metric([name, running, waiting, str(self.max_loras)], time.time())
        yield family


def _names(sequences: Sequence[Any]) -> str:
    return ",".join(sorted({s.extras.adapter.name for s in sequences if s.extras.adapter is not None}))


def register(
    registry: CollectorRegistry, schedulers: Callable[[], Mapping[str, Sequence[Any]]], max_loras: int
) -> None:
    registry.register(LoraInfo(schedulers, max_loras))
