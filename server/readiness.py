"""Readiness: the `sluice.readiness` health status follows the memory breakers and the admission queues
(SERVING while any device takes new work, NOT_SERVING while draining), and the breaker gauges with it.
Liveness never follows them: a restart would lose the work in flight. A readiness check's answer carries
the replica's KV size and use in its trailing metadata (ReportingHealth), for routers that poll it (the
shim's prefix routing): what the replica can hold, known before any call shows it slow."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from server.metrics import Metrics
from server.protocol_metrics import kv_tokens_and_usage
from wire.metadata import KV_TOKENS, KV_USAGE, READINESS_SERVICE

if TYPE_CHECKING:
    from server.admission.interceptor import AdmissionInterceptor
    from server.placement import DevicePlacement


class ReportingHealth(HealthServicer):  # type: ignore[misc]  # grpc_health ships no stubs
    """grpc.health.v1, whose readiness answers also say the KV caches' tokens and the fraction in use (as
    the model-server protocol's gauges count them), computed per check from the gauges: no work per call."""

    def __init__(self, metrics: Metrics) -> None:
        super().__init__()
        self.metrics = metrics

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        if request.service == READINESS_SERVICE:
            tokens, usage = kv_tokens_and_usage(self.metrics)
            if tokens:  # no Generate model, or none has stepped yet: nothing to say
                context.set_trailing_metadata(((KV_TOKENS, str(int(tokens))), (KV_USAGE, f"{usage:.4f}")))
        return await super().Check(request, context)


async def track_readiness(
    health: HealthServicer,
    placements: Sequence[DevicePlacement],
    interceptor: AdmissionInterceptor,
    metrics: Metrics,
    *,
    interval_s: float,
) -> None:
    """Every `interval_s`, until cancelled: the breakers' gauges, then readiness where it changed."""
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    breaker = placements[0].breaker  # the memory gauges are the first device's, as admission's breaker is
    current = None
    while True:
        reading = breaker.last
        metrics.memory_used.labels(breaker.probe.name).set(reading.used_bytes)
        metrics.memory_reserved.labels(breaker.probe.name).set(reading.reserved_bytes)
        metrics.memory_budget.labels(breaker.probe.name).set(reading.budget_bytes)
        for placement in placements:
            metrics.device_breaker_open.labels(placement.label).set(int(placement.breaker.is_open))
        # Ready while any device takes work: DeviceGates is full only when every device is.
        breakers_open = all(p.breaker.is_open for p in placements)
        metrics.breaker_open.set(1 if breakers_open else 0)
        busy = breakers_open or any(gate.is_full() for gate in interceptor.gates)
        state = not_serving if busy or interceptor.draining else serving
        if state != current:
            await health.set(READINESS_SERVICE, state)
            current = state
        await asyncio.sleep(interval_s)
