"""The Inference Gateway's model-server protocol on a live server's /metrics (issue 33, acceptance 3): each
metric of kubernetes-sigs/gateway-api-inference-extension's docs/proposals/003-model-server-protocol under
the name the `sluice` engineConfig of deploy/k8s/ maps it to, read as the endpoint picker reads it (one
series per name, a gauge), with the protocol's meaning: queued and running requests while a server with
two sequence slots holds four long generations, the KV cache's use as a fraction, the block size and
blocks; and all back to zero when the generations end (cached prefixes count as free). The readiness check
says the same KV size and use in its trailing metadata (what the shim's prefix routing polls)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, start_server, wait_until
from wire.metadata import KV_TOKENS, KV_USAGE, READINESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
# The protocol's metrics -> the picker's engineConfig field that names Sluice's series.
PROTOCOL = {
    "TotalQueuedRequests": "queuedRequestsSpec",
    "TotalRunningRequests": "runningRequestsSpec",
    "KVCacheUtilization": "kvUsageSpec",
    "BlockSize and NumGPUBlocks": "cacheInfoSpec",
}


def sluice_engine_config() -> dict[str, str]:
    """The `sluice` entry of the picker's core-metrics-extractor in deploy/k8s/inference-gateway/."""
    for document in yaml.safe_load_all(
        (ROOT / "deploy/k8s/inference-gateway/inference-pool.yaml").read_text()
    ):
        if (
            document
            and document.get("kind") == "ConfigMap"
            and "endpoint-picker" in document["metadata"]["name"]
        ):
            config = yaml.safe_load(document["data"]["config.yaml"])
            for plugin in config["plugins"]:
                if plugin["type"] == "core-metrics-extractor":
                    engines = plugin["parameters"]["engineConfigs"]
                    return next(e for e in engines if e["name"] == "sluice")
    raise AssertionError("no core-metrics-extractor with a sluice engineConfig in deploy/k8s/")


def picked(server: ServerProcess) -> dict[str, tuple[str, dict[str, str], float]]:
    """Per spec of the sluice engineConfig, the one series the picker reads: (type, labels, value)."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out = {}
    for field in PROTOCOL.values():
        name = sluice_engine_config()[field]
        family = families[name]
        assert len(family.samples) == 1, (name, family.samples)  # the picker takes one series
        sample = family.samples[0]
        out[field] = (family.type, dict(sample.labels), sample.value)
    return out


def value(server: ServerProcess, field: str) -> float:
    return picked(server)[field][2]


def readiness_kv(server: ServerProcess) -> tuple[float, float]:
    """The KV tokens and use a readiness check's trailing metadata reports."""
    with grpc.insecure_channel(server.target) as channel:
        request = health_pb2.HealthCheckRequest(service=READINESS_SERVICE)
        _, call = health_pb2_grpc.HealthStub(channel).Check.with_call(request, timeout=5)
        reported = dict(call.trailing_metadata() or ())
    return float(reported[KV_TOKENS]), float(reported[KV_USAGE])


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server("--models", "byte-lm", "--max-sequences", "2", "--probe-interval-s", "0.05")
    try:
        yield process
    finally:
        process.terminate()


def test_the_picker_reads_sluices_gauges_with_the_protocols_meaning(server: ServerProcess) -> None:
    series = picked(server)
    assert {kind for kind, _, _ in series.values()} == {"gauge"}
    assert series["queuedRequestsSpec"][2] == 0 and series["runningRequestsSpec"][2] == 0
    assert series["kvUsageSpec"][2] == 0
    labels = series["cacheInfoSpec"][1]
    samples = server.metrics()
    capacity = sum(
        v for (name, _), v in samples.items()
        if name in ("sluice_kv_tokens_reserved", "sluice_kv_tokens_cached", "sluice_kv_tokens_free")
    )  # fmt: skip
    assert labels == {"block_size": "16", "num_gpu_blocks": str(int(capacity) // 16)} and capacity > 0
    assert readiness_kv(server) == (capacity, 0.0)

    sampling = pb.SamplingParams(max_tokens=1000, ignore_eos=True)
    request = pb.GenerateRequest(model="byte-lm", text="a long generation", sampling=sampling)
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        calls = [stub.Generate(request, timeout=120) for _ in range(4)]
        try:
            # Two run (the server's two sequence slots), two wait for a slot.
            wait_until(
                lambda: (
                    value(server, "runningRequestsSpec") == 2 and value(server, "queuedRequestsSpec") == 2
                ),
                what="two running, two waiting",
            )
            samples = server.metrics()  # one scrape: the fraction is the tokens running sequences hold
            kv = {n: v for (n, _), v in samples.items() if n.startswith("sluice_kv_tokens_")}
            capacity = (
                kv["sluice_kv_tokens_reserved"] + kv["sluice_kv_tokens_cached"] + kv["sluice_kv_tokens_free"]
            )
            usage = samples[("sluice_server_kv_cache_usage_ratio", ())]
            assert 0 < usage < 1 and usage == pytest.approx(kv["sluice_kv_tokens_reserved"] / capacity)
            tokens, used = readiness_kv(server)  # the generations run on: the same held tokens
            assert tokens == capacity and 0 < used < 1
        finally:
            for call in calls:
                call.cancel()
    wait_until(
        lambda: value(server, "runningRequestsSpec") == 0 and value(server, "queuedRequestsSpec") == 0,
        what="nothing running or waiting",
    )
    wait_until(
        lambda: value(server, "kvUsageSpec") == 0, what="the KV cache free (cached prefixes evictable)"
    )
