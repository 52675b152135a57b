"""The real server and shim as test subprocesses on port 0 (launcher.services), with the tests'
conventions: stderr to a file, lines printed earlier count for a wait, metrics scraped on demand, and every
child dies with the test run however that ends."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.prometheus import Samples, scrape, total
from launcher.children import Child
from launcher.services import START_TIMEOUT_S, ServerChild, ShimChild, repository_root, wait_until
from server.model_selection import EMBEDDED_MODELS

ROOT = repository_root()

__all__ = [
    "ROOT",
    "SHARED_MODELS",
    "Process",
    "ServerProcess",
    "ShimProcess",
    "await_server",
    "spawn",
    "spawn_server",
    "start_server",
    "start_servers",
    "start_shim",
    "wait_until",
]


def _options(name: str) -> dict[str, Any]:
    stderr = Path(tempfile.mkstemp(prefix=f"sluice-{name}-", suffix=".log")[1])
    return {"cwd": ROOT, "stderr_path": stderr, "die_with_parent": True}


class Process(Child):
    """A child a test started; waits see the lines printed before them too."""

    def wait_for_line(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        return self.wait_for(pattern, timeout, rescan=True)

    def terminate(self, timeout: float = 60.0) -> int:
        return self.stop(timeout)


def spawn(name: str, args: list[str]) -> Process:
    """`python ARGS` from the repository root."""
    return Process(name, [sys.executable, *args], **_options(name))


class ServerProcess(ServerChild, Process):
    def metrics(self) -> Samples:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return total(self.metrics(), name, **labels)

    def readiness(self) -> str:
        """The server's `sluice.readiness` health status by name (SERVING, NOT_SERVING)."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(self.target) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="sluice.readiness"), timeout=5
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


def _entry(module: str, fd_limit: int | None) -> list[str]:
    """`-m module`, or the same run with RLIMIT_NOFILE set to `fd_limit` (soft and hard) first."""
    if fd_limit is None:
        return ["-m", module]
    return [
        "-c",
        f"import resource, runpy; resource.setrlimit(resource.RLIMIT_NOFILE, ({fd_limit}, {fd_limit})); "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)",
    ]


# CI runs the admission, cancellation and deadline suites a second time against N front-end processes.
FRONTENDS = os.environ.get("SLUICE_TEST_FRONTENDS")


# What a server a test starts without naming its models serves: the embedded models a start-up loads in
# about a second. smollm2 (seconds, a transformers import) and all-minilm-l6-v2 (about 6 CPU-s at each
# start: its tokenizer and weights) load only where a test names them, as the session's server does.
FAST_MODELS = ("mlp", "byte-lm")
# Every embedded model but smollm2: the session's shared server, which the client suites list and call.
SHARED_MODELS = tuple(name for name in EMBEDDED_MODELS if name != "smollm2")


def _spawn_server(
    flags: tuple[str, ...], fd_limit: int | None, env: Mapping[str, str] | None = None
) -> ServerProcess:
    base = ["--port", "0", "--metrics-port", "0", "--log-level", "WARNING"]
    if not any(flag.split("=")[0] in ("--models", "--hf-models") for flag in flags):
        base += ["--models", ",".join(FAST_MODELS)]
    if FRONTENDS and "--frontends" not in flags:
        base += ["--frontends", FRONTENDS]
    return ServerProcess([*base, *flags], entry=_entry("server", fd_limit), env=env, **_options("server"))


def _await_server(server: ServerProcess, wait_ready: bool) -> ServerProcess:
    server.wait_listening(START_TIMEOUT_S, rescan=True)
    if wait_ready:
        server.wait_ready(START_TIMEOUT_S, rescan=True)
    return server


def start_server(
    *flags: str, wait_ready: bool = True, fd_limit: int | None = None, env: Mapping[str, str] | None = None
) -> ServerProcess:
    """`python -m server` on port 0; `fd_limit` starts it with that soft and hard RLIMIT_NOFILE; `env` adds
    to the environment; with SLUICE_TEST_FRONTENDS=N set, behind N front ends (docs/frontends.md)."""
    return _await_server(_spawn_server(flags, fd_limit, env), wait_ready)


def spawn_server(*flags: str) -> ServerProcess:
    """`start_server(*flags)`'s process, spawned but not awaited: the test does its own work (a reference
    model's load) while the server starts, then calls await_server. Spawn on the test's main thread: the
    child dies with the thread that spawned it (PR_SET_PDEATHSIG), not only with the process."""
    return _spawn_server(flags, None)


def await_server(server: ServerProcess) -> ServerProcess:
    """The spawned server once ready; stopped (and the wait's error raised) if it does not get there."""
    try:
        return _await_server(server, True)
    except BaseException:
        server.terminate()
        raise


def start_servers(count: int, *flags: str) -> list[ServerProcess]:
    """`count` replicas of `start_server(*flags)`, started side by side: most of a start is importing
    torch on one core, so the replicas of a fleet overlap instead of queueing. All are ready on return;
    if one fails to start, the ones already spawned are stopped."""
    servers = [_spawn_server(flags, None) for _ in range(count)]
    try:
        return [_await_server(server, True) for server in servers]
    except BaseException:
        for server in servers:
            server.terminate()
        raise


class ShimProcess(ShimChild, Process):
    pass


def start_shim(
    upstream: str, *flags: str, fd_limit: int | None = None, env: Mapping[str, str] | None = None
) -> ShimProcess:
    """`python -m shim` in front of `upstream` on port 0; `fd_limit` and `env` as for start_server."""
    shim = ShimProcess(
        ["--upstream", upstream, "--host", "127.0.0.1", "--port", "0", *flags],
        entry=_entry("shim", fd_limit),
        env=env,
        **_options("shim"),
    )
    shim.wait_listening(START_TIMEOUT_S, rescan=True)
    return shim
