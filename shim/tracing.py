"""The shim's span of each API request (OpenTelemetry's HTTP server conventions): it continues the caller's
W3C `traceparent` or starts a trace, is the current span while the request is served (so the upstream
channel's interceptors send it on as the gRPC calls' parent, shim/upstream/forwarding.py), and ends when
the response, an SSE stream included, has ended. Probes (health, /metrics) are not traced.

Added only with tracing on (`--otlp-endpoint`, or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT): a shim without
tracing has no such middleware at all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from process.tracing import Tracing, extract_pairs
from shim.families import Families


class TracingMiddleware:
    def __init__(self, app: ASGIApp, *, tracing: Tracing, families: Families) -> None:
        self.app = app
        self.tracer = tracing.tracer
        self.families = families

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.families.in_api(scope["path"]):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(
            f"{method} {path}",
            context=extract_pairs(scope["headers"]),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path, "url.scheme": scope["scheme"]},
        )
        attached = otel_context.attach(trace.set_span_in_context(span))
        status = 0

        async def traced_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:
            span.record_exception(exc)
            raise
        finally:
            otel_context.detach(attached)
            route = getattr(scope.get("route"), "path", None)
            if route:  # the route's template, not the path: /v1/models/{model_id}, one name for all
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            if status:
                span.set_attribute("http.response.status_code", status)
            if status == 0 or status >= 500:
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute("error.type", str(status) if status else "no response")
            span.end()


def note_usage(usage: Mapping[str, Any], *, model: str, metrics: Mapping[str, float]) -> None:
    """The GenAI attributes of the request's span, where one is recording: model, tokens, latencies."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attributes(
        {
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": int(usage.get("prompt_tokens", 0)),
            "gen_ai.usage.output_tokens": int(usage.get("completion_tokens", 0)),
            "gen_ai.latency.time_in_queue": metrics["queue_time_ms"] / 1000,
            "gen_ai.latency.time_to_first_token": metrics["time_to_first_token_ms"] / 1000,
        }
    )
