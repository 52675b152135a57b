"""OpenTelemetry traces (issue 22, item 1 and acceptance 1): a real OTLP/gRPC receiver (tests/support/otlp.py)
gets one trace per chat completion through the shim: the shim's span continues the caller's `traceparent`,
the server's call span is its child, and admission, batch, prefill and decode are the call span's children,
with the queue time the response reports. A refused call's admission span names the refusal; a collector
that is down costs the calls nothing."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

CALL = "sluice.inference.v1.InferenceService/Generate"
SERVER_KIND, ERROR = 2, 2  # OTLP's SPAN_KIND_SERVER and STATUS_CODE_ERROR


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def stack(receiver: OtlpReceiver) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    server = start_server("--models", "byte-lm,mlp", "--otlp-endpoint", receiver.endpoint)
    shim = start_shim(server.target, "--otlp-endpoint", receiver.endpoint)
    yield server, shim
    shim.terminate()
    assert server.terminate() == 0, server.diagnostics()


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def one(spans: list[ReceivedSpan], name: str, service: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and s.service == service]
    assert len(found) == 1, [(s.service, s.name) for s in spans]
    return found[0]


def test_one_chat_completion_is_one_trace_across_shim_and_server(
    stack: tuple[ServerProcess, ShimProcess], receiver: OtlpReceiver
) -> None:
    _, shim = stack
    trace_id, caller_span, header = traceparent()
    body = {"model": "byte-lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    response = httpx.post(
        f"{shim.url}/v1/chat/completions",
        json={**body, "ignore_eos": True},
        headers={"traceparent": header},
        timeout=30,
    )
    assert response.status_code == 200
    answer = response.json()
    wanted = {"sluice.admission", "sluice.batch", "sluice.prefill", "sluice.decode", CALL}
    wait_until(lambda: wanted <= {s.name for s in receiver.spans(trace_id)}, what="the server's spans")
    wait_until(lambda: len(receiver.spans(trace_id)) >= 6, what="the shim's span")
    spans = receiver.spans(trace_id)
    edge = one(spans, "POST /v1/chat/completions", "sluice-shim")
    assert edge.parent_span_id == caller_span and edge.kind == SERVER_KIND
    assert edge.attributes["http.route"] == "/v1/chat/completions"
    assert edge.attributes["http.response.status_code"] == 200
    assert edge.attributes["gen_ai.usage.output_tokens"] == 6
    call = one(spans, CALL, "sluice-server")
    assert call.parent_span_id == edge.span_id and call.kind == SERVER_KIND
    assert (
        call.attributes["rpc.system.name"] == "grpc" and call.attributes["rpc.response.status_code"] == "OK"
    )
    assert call.attributes["gen_ai.request.model"] == "byte-lm"
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"] == 6
    assert call.attributes["gen_ai.response.finish_reasons"] == ["length"]
    # The queue time in the trace is the one in the response.
    queue_ms = call.attributes["gen_ai.latency.time_in_queue"] * 1000
    assert queue_ms == pytest.approx(answer["metrics"]["queue_time_ms"], abs=0.001)
    children = {name: one(spans, name, "sluice-server") for name in wanted - {CALL}}
    assert all(child.parent_span_id == call.span_id for child in children.values())
    admission, batch = children["sluice.admission"], children["sluice.batch"]
    prefill, decode = children["sluice.prefill"], children["sluice.decode"]
    assert admission.start_ns >= call.start_ns and decode.end_ns <= call.end_ns
    assert admission.end_ns <= batch.end_ns <= prefill.end_ns <= decode.end_ns
    assert batch.attributes["sluice.batch.size"] >= 1 and batch.attributes["sluice.batch.step"] >= 0
    assert decode.attributes["gen_ai.usage.output_tokens"] == 6
    # The server ends its span as its handler returns, which may be after the shim has answered.
    assert edge.start_ns <= call.start_ns


def test_a_request_without_traceparent_starts_a_trace_at_the_shim(
    stack: tuple[ServerProcess, ShimProcess], receiver: OtlpReceiver
) -> None:
    _, shim = stack
    before = {s.trace_id for s in receiver.spans()}
    response = httpx.post(
        f"{shim.url}/v1/generate", json={"model": "byte-lm", "prompt": "x", "max_tokens": 2}, timeout=30
    )
    assert response.status_code == 200

    def fresh() -> list[ReceivedSpan]:
        return [s for s in receiver.spans() if s.trace_id not in before]

    wait_until(lambda: {"POST /v1/generate", CALL} <= {s.name for s in fresh()}, what="a new trace")
    edge = one(fresh(), "POST /v1/generate", "sluice-shim")
    assert edge.parent_span_id == ""
    assert one(fresh(), CALL, "sluice-server").parent_span_id == edge.span_id


def test_anthropics_messages_and_count_tokens_are_traced_as_every_route_is(
    stack: tuple[ServerProcess, ShimProcess], receiver: OtlpReceiver
) -> None:
    """Issue 31, item 4: the new families' routes through the same tracing: the shim's span by route
    template, the server's call span (Generate, Tokenize) its child."""
    _, shim = stack
    hello = {"model": "byte-lm", "messages": [{"role": "user", "content": "hi"}]}
    for path, body, method in [
        ("/v1/messages", {**hello, "max_tokens": 3, "stream": True}, "Generate"),
        ("/v1/messages/count_tokens", hello, "Tokenize"),
    ]:
        trace_id, _, header = traceparent()
        answer = httpx.post(f"{shim.url}{path}", json=body, headers={"traceparent": header}, timeout=30)
        assert answer.status_code == 200, answer.text
        call_name = f"sluice.inference.v1.InferenceService/{method}"
        wanted = {f"POST {path}", call_name}
        wait_until(lambda: wanted <= {s.name for s in receiver.spans(trace_id)}, what=f"{path}'s spans")  # noqa: B023
        edge = one(receiver.spans(trace_id), f"POST {path}", "sluice-shim")
        assert edge.attributes["http.route"] == path and edge.attributes["http.response.status_code"] == 200
        call = one(receiver.spans(trace_id), call_name, "sluice-server")
        assert call.parent_span_id == edge.span_id and call.attributes["rpc.response.status_code"] == "OK"


def test_a_refused_call_has_an_admission_span_naming_the_refusal(
    stack: tuple[ServerProcess, ShimProcess], receiver: OtlpReceiver
) -> None:
    server, _ = stack
    trace_id, caller_span, header = traceparent()
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        request = pb.GenerateRequest(model="byte-lm", text="x", sampling=pb.SamplingParams(max_tokens=10**6))
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(request, metadata=(("traceparent", header),), timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_until(lambda: len(receiver.spans(trace_id)) >= 2, what="the refused call's spans")
    call = one(receiver.spans(trace_id), CALL, "sluice-server")
    assert call.parent_span_id == caller_span
    assert call.attributes["rpc.response.status_code"] == "INVALID_ARGUMENT"
    assert call.attributes["error.type"] == "LIMIT_EXCEEDED"
    assert call.status_code != ERROR  # the caller's mistake, not the server's (OpenTelemetry's gRPC rule)
    trace_id, _, header = traceparent()
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as unknown:
            list(
                stub.Generate(pb.GenerateRequest(model="nope", text="x"), metadata=(("traceparent", header),))
            )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    wait_until(lambda: len(receiver.spans(trace_id)) >= 2, what="the unknown model's spans")
    admission = one(receiver.spans(trace_id), "sluice.admission", "sluice-server")
    assert admission.attributes["sluice.refused_by"] == "MODEL_NOT_FOUND" and admission.status_code == ERROR


def test_an_infer_call_is_one_span_with_its_phases_as_attributes(
    stack: tuple[ServerProcess, ShimProcess], receiver: OtlpReceiver
) -> None:
    server, _ = stack
    trace_id, caller_span, header = traceparent()
    x = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=bytes(2048))
    with grpc.insecure_channel(server.target) as channel:
        answer = pb_grpc.InferenceServiceStub(channel).Infer(
            pb.InferRequest(model="mlp", inputs=[x]), metadata=(("traceparent", header),), timeout=30
        )
    wait_until(lambda: len(receiver.spans(trace_id)) >= 1, what="the Infer call's span")
    (call,) = receiver.spans(trace_id)
    assert call.name == "sluice.inference.v1.InferenceService/Infer" and call.parent_span_id == caller_span
    assert call.attributes["sluice.batch.size"] == answer.timings.batch_size
    compute = answer.timings.compute.ToNanoseconds() / 1e9
    assert call.attributes["sluice.compute_s"] == pytest.approx(compute, abs=1e-9)
    queue = answer.timings.queue_wait.ToNanoseconds() / 1e9
    assert call.attributes["gen_ai.latency.time_in_queue"] == pytest.approx(queue, abs=1e-9)
    waits = call.attributes["sluice.queue_wait_s"] + call.attributes["sluice.batch.wait_s"]
    assert waits == pytest.approx(queue, abs=1e-6)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_collector_that_is_down_costs_only_the_spans() -> None:
    server = start_server("--models", "byte-lm", "--otlp-endpoint", f"127.0.0.1:{closed_port()}")
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            sampling = pb.SamplingParams(max_tokens=4, ignore_eos=True)  # four tokens, whatever the weights
            request = pb.GenerateRequest(model="byte-lm", text="x", sampling=sampling)
            started = time.monotonic()
            for _ in range(20):
                assert list(stub.Generate(request, timeout=30))[-1].usage.completion_tokens == 4
            assert time.monotonic() - started < 10
    finally:
        stopping = time.monotonic()
        assert server.terminate() == 0, server.diagnostics()
    assert time.monotonic() - stopping < 15  # the export thread does not hold up the drain
