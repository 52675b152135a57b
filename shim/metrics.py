"""The shim's Prometheus instruments and the ASGI middleware that counts every request by route template and
status; /metrics serves them. Under --workers N (PROMETHEUS_MULTIPROC_DIR set by shim.workers) every worker
writes its instruments to that directory and a scrape answered by any worker sums all of them."""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ShimMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "sluice_shim_requests_total", "HTTP requests answered, by route template and status.",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.open_streams = Gauge(
            "sluice_shim_open_streams", "SSE streams being relayed.", registry=r, multiprocess_mode="livesum"
        )
        self.disconnects = Counter(
            "sluice_shim_disconnects_total", "Clients that left before their answer was complete.",
            ["route"], registry=r,
        )  # fmt: skip
        self.upstream = Histogram(
            "sluice_shim_upstream_seconds",
            "Time from sending an upstream call to its answer (streams: to their first message).",
            ["route"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.routed = Counter(
            "sluice_shim_routed_total", "Generate calls sent to each replica by prefix routing, and why.",
            ["replica", "reason"], registry=r,
        )  # fmt: skip
        self._counted: dict[tuple[str, int], Any] = {}
        self._shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

    def count(self, route: str, status: int) -> None:
        child = self._counted.get((route, status))
        if child is None:
            child = self._counted[(route, status)] = self.requests.labels(route, str(status))
        child.inc()

    def render(self) -> Response:
        registry = self.registry
        if self._shared_dir is not None:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self._shared_dir)  # type: ignore[no-untyped-call]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def metrics_of(request: Request) -> ShimMetrics:
    metrics: ShimMetrics = request.app.state.metrics
    return metrics


class CountingMiddleware:
    """Counts each HTTP request once, when its answer starts, under its route's template (a bounded label
    set: an unmatched path counts as `unmatched`)."""

    def __init__(self, app: ASGIApp, *, metrics: ShimMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                self.metrics.count(getattr(route, "path", "unmatched"), message["status"])
            await send(message)

        await self.app(scope, receive, counted)


class Timer:
    """Times one upstream call into the histogram (`with metrics_timer(...)`)."""

    __slots__ = ("_child", "_started")

    def __init__(self, metrics: ShimMetrics, route: str) -> None:
        self._child = metrics.upstream.labels(route)
        self._started = time.perf_counter()

    def __enter__(self) -> Timer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._child.observe(time.perf_counter() - self._started)
