"""Readiness: the `sluice.readiness` health status follows the memory breakers and the admission queues
(SERVING while any device takes new work, NOT_SERVING while draining), and the breaker gauges with it.
Liveness never follows them: a restart would lose the work in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from server.metrics import Metrics
from wire.metadata import READINESS_SERVICE

if TYPE_CHECKING:
    from server.admission.interceptor import AdmissionInterceptor
    from server.placement import DevicePlacement


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
