"""The Gateway API Inference Extension's model-server protocol (kubernetes-sigs/
gateway-api-inference-extension, docs/proposals/003-model-server-protocol): the server-wide gauges an
endpoint picker scrapes from /metrics to choose a pod, under Sluice's own names, mapped for the picker by
an `engineConfigs` entry named `sluice` (deploy/k8s/inference-pool.yaml; pods labelled
`llm-d.ai/engine-type: sluice`):

| protocol             | Sluice                                         | picker field          |
|----------------------|------------------------------------------------|-----------------------|
| TotalQueuedRequests  | sluice_server_requests_waiting                 | queuedRequestsSpec    |
| TotalRunningRequests | sluice_server_requests_running                 | runningRequestsSpec   |
| KVCacheUtilization   | sluice_server_kv_cache_usage_ratio (0 to 1)    | kvUsageSpec           |
| BlockSize, blocks    | sluice_server_cache_config_info{block_size, num_gpu_blocks} | cacheInfoSpec |

The picker reads one series per name, so these are totals over the models and methods, computed from the
per-model instruments when scraped (no work per request):
- waiting: requests waiting for an admission slot, plus Generate calls admitted but not yet in their
  model's running batch (waiting for KV memory or the next step), as vLLM counts its waiting queue;
- running: requests holding a slot, less those Generate calls: what runs now;
- KV use: tokens held by running sequences / the KV caches' tokens; cached prefixes are evictable and
  count as free, as vLLM's block pool counts them;
- blocks: the prefix cache's block (server/kv/arena.py ALIGN tokens) and how many fit the KV caches.
A LoRA gauge (`sluice_server_lora_requests_info`, labels max_lora, running_lora_adapters,
waiting_lora_adapters) joins them, and the `sluice` engineConfig gains `loraSpec`, once adapters exist."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from server.kv.arena import ALIGN

WAITING = "sluice_server_requests_waiting"
RUNNING = "sluice_server_requests_running"
KV_USAGE = "sluice_server_kv_cache_usage_ratio"
CACHE_INFO = "sluice_server_cache_config_info"
_GENERATE = "Generate"


def _samples(instrument: Any) -> Iterable[tuple[dict[str, str], float]]:
    for family in instrument.collect():
        for sample in family.samples:
            yield sample.labels, sample.value


def _by_model(instrument: Any) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for labels, value in _samples(instrument):
        totals[labels.get("model", "")] += value
    return totals


def kv_tokens_and_usage(metrics: Any) -> tuple[float, float]:
    """The KV caches' tokens (held, cached and free, all models) and the fraction running sequences hold."""
    reserved = sum(_by_model(metrics.kv_reserved).values())
    capacity = (
        reserved + sum(_by_model(metrics.kv_cached).values()) + sum(_by_model(metrics.kv_free).values())
    )
    return capacity, (reserved / capacity if capacity else 0.0)


class ProtocolMetrics(Collector):
    """Computes the protocol's gauges from the server's `Metrics` at each scrape."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        waiting = sum(value for _, value in _samples(m.waiting))
        holding = sum(value for _, value in _samples(m.in_flight))
        generating: dict[str, float] = defaultdict(float)
        for labels, value in _samples(m.in_flight):
            if labels.get("method") == _GENERATE:
                generating[labels.get("model", "")] += value
        in_batch = _by_model(m.sequences)
        joining = sum(max(0.0, calls - in_batch.get(model, 0.0)) for model, calls in generating.items())
        capacity, usage = kv_tokens_and_usage(m)
        yield _gauge(WAITING, "Requests waiting: for an admission slot, or admitted to join a batch.",
                     waiting + joining)  # fmt: skip
        yield _gauge(RUNNING, "Requests running: holding a slot, and generations in their batch.",
                     max(0.0, holding - joining))  # fmt: skip
        yield _gauge(KV_USAGE, "Tokens of the KV caches held by running sequences, as a fraction (0 to 1).",
                     usage)  # fmt: skip
        info = GaugeMetricFamily(
            CACHE_INFO, "The KV caches' block size (tokens) and blocks, as labels.",
            labels=["block_size", "num_gpu_blocks"],
        )  # fmt: skip
        info.add_metric([str(ALIGN), str(int(capacity) // ALIGN)], 1.0)
        yield info


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
