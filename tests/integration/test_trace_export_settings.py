"""The server's span export honours OpenTelemetry's standard OTEL_EXPORTER_OTLP_* settings as the shim's SDK
exporter does (issue 36, item 6), against a real, strict OTLP receiver (tests/support/otlp.py): a header the
collector requires (generic and per-signal variable), gzip, the per-signal endpoint over the generic one;
what is lost shows on /metrics while the server runs; a collector that is briefly UNAVAILABLE still gets
the spans."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import grpc
import httpx
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.otlp import OtlpReceiver, otlp_receiver
from tests.support.processes import ServerProcess, start_server, start_shim, wait_until

KEY = "x-collector-key=s3cret"
DROPPED = "sluice_trace_spans_dropped_total"
EXPORTED = "sluice_trace_spans_exported_total"
GENERATE = "sluice.inference.v1.InferenceService/Generate"
SPAN_WAIT_S = 20.0  # an export is retried for at most 15 s (process/otlp_sender.py)


@contextmanager
def traced_server(*flags: str, env: Mapping[str, str]) -> Iterator[ServerProcess]:
    server = start_server(*(flags if "--models" in flags else ("--models", "mlp", *flags)), env=env)
    try:
        yield server
    finally:
        assert server.terminate() == 0, server.diagnostics()


def traced_infer(server: ServerProcess) -> str:
    """One Infer call under a fresh sampled trace; returns the trace id."""
    trace_id = secrets.token_hex(16)
    header = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    x = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=bytes(2048))
    with grpc.insecure_channel(server.target) as channel:
        pb_grpc.InferenceServiceStub(channel).Infer(
            pb.InferRequest(model="mlp", inputs=[x]), metadata=(("traceparent", header),), timeout=30
        )
    return trace_id


def wait_for_span(receiver: OtlpReceiver, trace_id: str) -> None:
    wait_until(lambda: len(receiver.spans(trace_id)) == 1, SPAN_WAIT_S, what="the server's span")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_HEADERS": KEY},
        # The per-signal variable wins over the generic one (which here names the wrong key).
        {"OTEL_EXPORTER_OTLP_HEADERS": "x-collector-key=wrong", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": KEY},
    ],
    ids=["generic", "per-signal"],
)
def test_a_collector_that_requires_a_header_gets_the_servers_spans(env: dict[str, str]) -> None:
    with (
        otlp_receiver("--require-header", KEY) as receiver,
        traced_server("--otlp-endpoint", receiver.endpoint, env=env) as server,
    ):
        wait_for_span(receiver, traced_infer(server))
        assert receiver.refused("UNAUTHENTICATED") == 0
        wait_until(lambda: server.metric(EXPORTED) >= 1, what="the exported span counted")
        assert server.metric(DROPPED) == 0


def test_gzip_is_honoured() -> None:
    # A receiver with gzip turned off refuses a compressed export (UNIMPLEMENTED): proof that it was one.
    gzip = {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_COMPRESSION": "none"}
    with (
        otlp_receiver("--identity-only") as identity_only,
        traced_server("--otlp-endpoint", identity_only.endpoint, env=gzip) as server,
    ):
        traced_infer(server)
        wait_until(lambda: server.metric(DROPPED, reason="export_failed") >= 1, what="the refused export")
        assert identity_only.spans() == [] and server.metric(EXPORTED) == 0
    with otlp_receiver() as receiver, traced_server("--otlp-endpoint", receiver.endpoint, env=gzip) as server:
        wait_for_span(receiver, traced_infer(server))


def test_the_per_signal_endpoint_is_honoured_over_the_generic_one() -> None:
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        }
        # No --otlp-endpoint: the variables turn tracing on, in the server and in the shim alike.
        with traced_server("--models", "mlp,byte-lm", env=env) as server:
            wait_for_span(receiver, traced_infer(server))
            shim = start_shim(server.target, env=env)
            try:
                body = {"model": "byte-lm", "prompt": "x", "max_tokens": 2}
                assert httpx.post(f"{shim.url}/v1/generate", json=body, timeout=30).status_code == 200
                wait_until(
                    lambda: {"POST /v1/generate", GENERATE} <= {s.name for s in receiver.spans()},
                    SPAN_WAIT_S,
                    what="the shim's span and the server's",
                )
            finally:
                shim.terminate()
            (edge,) = [s for s in receiver.spans() if s.name == "POST /v1/generate"]
            (call,) = [s for s in receiver.spans() if s.name == GENERATE]
            assert call.parent_span_id == edge.span_id  # the shim sent its trace context on


def test_dropped_spans_show_on_metrics_while_the_server_runs() -> None:
    # The collector wants a header; the server sends none: every export is refused.
    with (
        otlp_receiver("--require-header", KEY) as receiver,
        traced_server("--otlp-endpoint", receiver.endpoint, env={}) as server,
    ):
        # Every reason's series is there, at 0, from the start (an alert on it needs the series).
        reasons = {dict(labels)["reason"] for name, labels in server.metrics() if name == DROPPED}
        assert {"export_failed", "queue_full", "buffer_full"} <= reasons
        assert server.metric(DROPPED) == 0
        for calls in (1, 2, 3):
            traced_infer(server)
            wait_until(
                lambda: server.metric(DROPPED, reason="export_failed") == calls,  # noqa: B023
                what=f"{calls} dropped spans on /metrics",
            )
        # UNAUTHENTICATED is not transient: each export was tried once, never retried.
        assert receiver.refused("UNAUTHENTICATED") == 3
        assert receiver.spans() == [] and server.metric(EXPORTED) == 0


def test_a_collector_that_is_briefly_unavailable_still_gets_the_spans() -> None:
    with (
        otlp_receiver("--unavailable", "3") as receiver,
        traced_server("--otlp-endpoint", receiver.endpoint, env={}) as server,
    ):
        wait_for_span(receiver, traced_infer(server))
        assert receiver.refused("UNAVAILABLE") == 3
        wait_until(lambda: server.metric(EXPORTED) >= 1, what="the exported span counted")
        assert server.metric(DROPPED) == 0
