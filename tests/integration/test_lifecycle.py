"""Acceptance 4 and 5: health across warm-up and drain (and /readyz following it);
SIGTERM during 8 streams."""

from __future__ import annotations

import signal
import threading

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import start_server, start_shim, wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(health: health_pb2_grpc.HealthStub) -> int:
    return int(health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status)


def test_health_follows_warmup_and_drain_and_readyz_follows_health() -> None:
    # Many warm-up passes hold the NOT_SERVING window open long enough to observe it.
    server = start_server("--warmup-steps", "400", "--grace-s", "20", wait_ready=False)
    shim = None
    try:
        with grpc.insecure_channel(server.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            # Watched from the moment the server listens: it loads and warms its models only after that.
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=120)
            assert next(watch).status == NOT_SERVING
            shim = start_shim(server.target)
            ready = httpx.get(f"{shim.url}/readyz", timeout=10)
            if check(health) == NOT_SERVING:  # still warming up after /readyz answered
                assert ready.status_code == 503
            assert next(watch).status == SERVING
            assert httpx.get(f"{shim.url}/readyz", timeout=10).status_code == 200

            # A stream in flight keeps the drain going while we look at health.
            stub = pb_grpc.InferenceServiceStub(channel)
            stream = stub.Generate(
                pb.GenerateRequest(
                    model="byte-lm",
                    text="drain",
                    # ignore_eos: the stream ends by length or by the drain, whatever the model's weights.
                    sampling=pb.SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True),
                )
            )
            next(stream)
            server.proc.send_signal(signal.SIGTERM)
            assert next(watch).status == NOT_SERVING
            assert check(health) == NOT_SERVING
            assert httpx.get(f"{shim.url}/readyz", timeout=10).status_code == 503
            with pytest.raises(grpc.RpcError) as refused:
                stub.Infer(pb.InferRequest(model="mlp"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            last = list(stream)[-1]
            assert last.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_CANCELLED)
            if last.finish_reason == pb.FINISH_REASON_LENGTH:
                assert last.usage.completion_tokens == 1000
            else:
                assert last.error.reason == "SHUTTING_DOWN"
        assert server.proc.wait(timeout=60) == 0
    finally:
        if shim is not None:
            shim.terminate()
        server.terminate()


def test_sigterm_during_eight_streams_ends_each_cleanly_and_exits_zero() -> None:
    server = start_server("--grace-s", "1", "--context-length", "4096")
    results: list[pb.GenerateResponse | BaseException] = [None] * 8  # type: ignore[list-item]
    started = threading.Barrier(9)

    def consume(index: int) -> None:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            request = pb.GenerateRequest(
                model="byte-lm",
                text=f"stream {index}",
                sampling=pb.SamplingParams(max_tokens=100 + 400 * index, seed=index, ignore_eos=True),
            )
            try:
                stream = stub.Generate(request, timeout=60)
                message = next(stream)
                started.wait()
                for message in stream:  # noqa: B007 - the last one is what we check
                    pass
                results[index] = message
            except BaseException as exc:
                results[index] = exc
                started.abort()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    started.wait(timeout=60)
    server.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=60)
    assert server.proc.wait(timeout=60) == 0, server.diagnostics()
    reasons = {r.finish_reason for r in results if isinstance(r, pb.GenerateResponse)}
    # The longest stream (2,900 decode steps) cannot finish within the grace period: it is ended cleanly.
    assert pb.FINISH_REASON_CANCELLED in reasons, results
    for index, result in enumerate(results):
        assert isinstance(result, pb.GenerateResponse), result
        if result.finish_reason == pb.FINISH_REASON_CANCELLED:
            assert result.error.reason == "SHUTTING_DOWN"
            assert 0 < result.usage.completion_tokens < 100 + 400 * index
        else:
            assert result.finish_reason == pb.FINISH_REASON_LENGTH
            assert result.usage.completion_tokens == 100 + 400 * index
    wait_until(lambda: server.proc.poll() is not None, what="server exit")
