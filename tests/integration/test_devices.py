"""`--devices cpu,cpu` (issue 13, item 4): one replica of every model per device, each with its own slots and
model thread; calls go to the least-loaded device, so two devices hold twice the calls in flight and run
their batches side by side; Generate streams run on either; the listing and the slot metric count both."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.integration.test_admission import request, slow, vector
from tests.support import byte_lm_reference
from tests.support.processes import ServerProcess, start_server, wait_until

SLOTS = 2  # per device


@pytest.fixture(scope="module")
def two_devices() -> Iterator[ServerProcess]:
    server = start_server(
        "--devices", "cpu,cpu", "--plugins", "tests.support.faulty_models", "--models", "faulty,byte-lm",
        "--max-concurrency", str(SLOTS), "--max-batch-size", str(SLOTS), "--max-queue", "16",
        "--max-delay-ms", "200",  # each device's calls form one batch of SLOTS
    )  # fmt: skip
    yield server
    assert server.terminate() == 0, server.diagnostics()


@pytest.mark.serial  # compares its wall time against one device's: run alone
def test_two_devices_hold_and_compute_twice_the_calls(two_devices: ServerProcess) -> None:
    server = two_devices
    assert server.metric("sluice_admission_slots", model="faulty", method="Infer") == 2 * SLOTS
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        with ThreadPoolExecutor(2 * SLOTS) as pool:
            started = time.monotonic()
            calls = [
                pool.submit(stub.Infer, request("faulty", slow(1.0, i)), timeout=30) for i in range(2 * SLOTS)
            ]
            wait_until(
                lambda: (
                    server.metric("sluice_requests_in_flight", model="faulty", method="Infer") == 2 * SLOTS
                ),
                what="every call admitted at once: both devices' slots",
            )
            assert server.metric("sluice_requests_waiting", model="faulty", method="Infer") == 0
            for call in calls:
                call.result()
            elapsed = time.monotonic() - started
    # One batch of SLOTS per device, side by side on their own model threads: ~1.2 s. One device with
    # the same slots in all would run two batches of SLOTS one after the other: ~2.2 s.
    assert elapsed < 1.8, elapsed


def test_streams_run_on_either_device(two_devices: ServerProcess) -> None:
    with grpc.insecure_channel(two_devices.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        generate = pb.GenerateRequest(
            model="byte-lm", text="hi", sampling=pb.SamplingParams(max_tokens=200, ignore_eos=True, seed=3)
        )
        with ThreadPoolExecutor(2) as pool:
            texts = list(
                pool.map(lambda _: "".join(r.text for r in stub.Generate(generate, timeout=60)), range(2))
            )
    # The same seeded model on both devices: each says what the model says.
    expected = byte_lm_reference.text(byte_lm_reference.generate("hi", 200, seed=3, ignore_eos=True))
    assert texts == [expected, expected]
    wait_until(lambda: two_devices.metric("sluice_kv_slots_in_use") == 0, what="both devices' slots free")


def _computed(server: ServerProcess) -> list[float]:
    """Items each device's batcher computed."""
    return [
        server.metric("sluice_batch_size_sum", model="mlp", method="Infer", device=f"cpu#{i}")
        for i in range(2)
    ]


def _breakers_open(server: ServerProcess) -> int:
    return sum(1 for i in range(2) if server.metric("sluice_device_breaker_open", device=f"cpu#{i}"))


def test_a_device_over_its_watermark_takes_nothing_and_nothing_is_refused(tmp_path: Path) -> None:
    probe = tmp_path / "memory"
    server = start_server(
        "--devices", "cpu,cpu", "--models", "mlp", "--memory-probe", f"fake:{probe}",
        "--max-concurrency", "4", "--max-queue", "64", "--probe-interval-s", "0.02",
    )  # fmt: skip
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            with ThreadPoolExecutor(8) as pool:  # both devices share the load
                list(pool.map(lambda i: stub.Infer(request("mlp", vector(i)), timeout=30), range(64)))
            computed = _computed(server)
            assert min(computed) > 0, computed
            Path(f"{probe}.0").write_text("0.99")  # device 0 over its high watermark
            wait_until(lambda: _breakers_open(server) >= 1, what="device 0's breaker open")
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: stub.Infer(request("mlp", vector(i)), timeout=30), range(64)))
            after = _computed(server)
        assert after[0] == computed[0] and after[1] == computed[1] + 64, (computed, after)
        assert server.metric("sluice_requests_refused_total") == 0
        assert server.readiness() == "SERVING"  # one device still takes work
    finally:
        assert server.terminate() == 0, server.diagnostics()
