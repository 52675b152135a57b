"""Tenants' rates held across replicas in Redis (issue 33, acceptance 2): a tenant limited to R requests/s
calls three replicas that share a real redis-server (Debian's, started here on a unix socket) and gets
R x (1 +/- 0.1) across the fleet, where each replica alone would allow R (3R in all). With Redis stopped
mid-run each replica falls back to its share, R/3, so the fleet still allows about R, no call fails for
any other reason, and `sluice_tenant_store_up` and `sluice_tenant_store_fallbacks_total` say so; Redis
restarted, the fleet-wide limit returns."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.integration.test_admission import FEATURES, request
from tests.support.processes import ServerProcess, start_servers, wait_until

RATE = 10.0  # the tenant's requests/s
OFFERED = 15.0  # per replica: 45/s against the fleet, more than 3 x RATE would admit
TOKEN = "fleet-tenant-token"
WINDOW_S = 3.0


class Redis:
    """redis-server on a unix socket in `directory`, no persistence; stopped and started again in place."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (Debian: redis-server; scripts/setup_test_tools.sh)")
        self.binary, self.socket = binary, directory / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._answers, what="redis-server answering")

    def _answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1).ping())
        except (redis.RedisError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Redis, list[ServerProcess]]]:
    directory = tmp_path_factory.mktemp("fleet-limits")
    keys = directory / "keys.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    keys.write_text(f'[[tenant]]\nname = "metered"\ntoken_sha256 = "{digest}"\nrate_per_s = {RATE}\n')
    store = Redis(directory)
    store.start()
    servers: list[ServerProcess] = []
    try:
        servers = start_servers(3, "--models", "mlp", "--auth-keys", str(keys), "--tenant-store", store.url)
        yield store, servers
    finally:
        for server in servers:
            server.terminate()
        store.stop()


class Load:
    """OFFERED calls/s of the tenant to each replica, paced, each outcome kept with its time."""

    def __init__(self, servers: list[ServerProcess]) -> None:
        self.outcomes: list[tuple[float, grpc.StatusCode]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._call, args=(s.target,)) for s in servers]
        for thread in self.threads:
            thread.start()

    def _call(self, target: str) -> None:
        message = request("mlp", np.ones(FEATURES, dtype=np.float32))
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        with grpc.insecure_channel(target) as channel:
            infer = pb_grpc.InferenceServiceStub(channel).Infer
            start, sent = time.monotonic(), 0
            while not self.stop.is_set():
                try:
                    infer(message, metadata=metadata, timeout=10)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as error:
                    code = error.code()
                self.outcomes.append((time.monotonic(), code))
                sent += 1
                self.stop.wait(max(0.0, start + sent / OFFERED - time.monotonic()))  # the pace, not a wait

    def admitted_per_s(self, start: float, end: float) -> float:
        return sum(1 for at, code in self.outcomes if start <= at < end and code == grpc.StatusCode.OK) / (
            end - start
        )

    def window(self) -> float:
        """The admitted rate over the next WINDOW_S seconds, starting once the last change settled (1 s:
        the buckets' burst spent)."""
        start = time.monotonic() + 1.0
        wait_until(lambda: time.monotonic() >= start + WINDOW_S, timeout=WINDOW_S + 5, what="the window")
        return self.admitted_per_s(start, start + WINDOW_S)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def store_up(servers: list[ServerProcess]) -> list[float]:
    return [s.metric("sluice_tenant_store_up") for s in servers]


def test_a_tenants_rate_holds_across_replicas_and_falls_back_to_shares(
    fleet: tuple[Redis, list[ServerProcess]],
) -> None:
    store, servers = fleet
    wait_until(lambda: store_up(servers) == [1, 1, 1], what="every replica reaching the store")
    load = Load(servers)
    try:
        fleet_wide = load.window()
        store.stop()
        stopped_at = time.monotonic()
        fallback = load.window()
        assert store_up(servers) == [0, 0, 0]
        assert all(s.metric("sluice_tenant_store_fallbacks_total") > 0 for s in servers)
        store.start()
        wait_until(lambda: store_up(servers) == [1, 1, 1], what="every replica back on the store")
        restored = load.window()
    finally:
        load.close()
    figures = {"fleet-wide": fleet_wide, "fallback": fallback, "restored": restored}
    assert RATE * 0.9 <= fleet_wide <= RATE * 1.1, figures
    # Each replica allows R/3 alone: the fleet about R, never a refusal for any other reason.
    assert RATE * 0.9 <= fallback <= RATE * 1.15, figures
    assert RATE * 0.9 <= restored <= RATE * 1.1, figures
    codes = {code for at, code in load.outcomes}
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert any(at > stopped_at and code == grpc.StatusCode.OK for at, code in load.outcomes)
