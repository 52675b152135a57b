"""`--frontends N` (docs/frontends.md): N front-end processes share the port and forward to the one engine;
large bodies cross through shared memory and leave nothing behind; a front end that dies ends the engine
with an error; a busy port is one line and exit 2, as without front ends. The admission, cancellation and
deadline suites also run against `--frontends 2` in CI (Makefile, SLUICE_TEST_FRONTENDS)."""

from __future__ import annotations

import os
import signal
import socket

import grpc
import numpy as np
import psutil
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, spawn, start_server, wait_until


def front_ends(server: ServerProcess) -> list[psutil.Process]:
    children = psutil.Process(server.proc.pid).children()
    return [c for c in children if "server.frontends.frontend" in " ".join(c.cmdline())]


def segments() -> set[str]:
    """The server's own shared-memory segments (arenas, engines, wire payloads); a KServe client's
    `sluice-shm-*` regions belong to other tests, which may run beside this one (pytest-xdist)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("sluice-") and not n.startswith("sluice-shm-")}


def infer(stub: pb_grpc.InferenceServiceStub, x: np.ndarray, model: str = "mlp") -> pb.InferResponse:
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=list(x.shape), raw_contents=x.tobytes())
    response: pb.InferResponse = stub.Infer(pb.InferRequest(model=model, inputs=[tensor]), timeout=30)
    return response


def test_front_ends_share_the_port_and_carry_calls_of_every_size() -> None:
    before = segments()
    server = start_server(
        "--frontends", "2", "--models", "mlp,bulky", "--plugins", "tests.support.faulty_models"
    )
    try:
        processes = front_ends(server)
        assert len(processes) == 2
        # A connection each (grpc shares one between channels to the same target otherwise): the kernel
        # spreads connections, not calls.
        own = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.insecure_channel(server.target, options=own) for _ in range(16)]
        try:
            for channel in channels:
                answer = infer(pb_grpc.InferenceServiceStub(channel), np.ones(512, np.float32))
                assert len(answer.outputs[0].raw_contents) == 512 * 4
            # The kernel spread the 16 connections over both front ends (all on one: 1 in 32,768).
            for process in processes:
                ours = [c for c in process.net_connections() if c.laddr and c.laddr.port == server.port]
                assert any(c.status == psutil.CONN_ESTABLISHED for c in ours), process.pid
            big = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: through shared memory
            answer = infer(pb_grpc.InferenceServiceStub(channels[0]), big, model="bulky")
            assert np.frombuffer(answer.outputs[0].raw_contents, np.float32)[0] == np.float32(big.sum())
        finally:
            for channel in channels:
                channel.close()
        assert {s for s in segments() - before if not s.startswith("sluice-arena-")} == set()
    finally:
        assert server.terminate() == 0, server.diagnostics()
    assert segments() == before  # the front ends' rings too
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def test_a_front_end_that_dies_ends_the_engine_with_an_error() -> None:
    before = segments()
    server = start_server("--frontends", "2", "--models", "mlp")
    try:
        victim, other = front_ends(server)
        victim.send_signal(signal.SIGKILL)
        assert server.proc.wait(timeout=60) == 1, server.diagnostics()
        wait_until(lambda: not other.is_running(), what="the other front end stopped and reaped")
    finally:
        server.terminate()
    assert segments() == before  # the killed one's arena too


@pytest.mark.parametrize("shared", [False, True], ids=["plain listener", "SO_REUSEPORT listener"])
def test_a_busy_port_is_one_line_and_exit_2(shared: bool) -> None:
    """Even a listener that shares its port (another Sluice's front ends) is not joined silently."""
    with socket.socket() as holder:
        if shared:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = spawn("server", ["-m", "server", "--frontends", "2", "--port", str(port), "--models", "mlp"])
        assert proc.proc.wait(timeout=60) == 2
        lines = proc.stderr_path.read_text().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"sluice serve: invalid setting port: cannot listen on 127.0.0.1:{port}"
        ), lines


def test_a_signal_to_the_whole_process_group_still_drains_through_the_engine() -> None:
    """Ctrl-C reaches every process of the group: the front ends keep carrying the engine's open stream
    until it ends, instead of cutting it."""
    server = start_server("--frontends", "2", "--models", "byte-lm", "--grace-s", "30")
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            request = pb.GenerateRequest(
                model="byte-lm", text="hi", sampling=pb.SamplingParams(max_tokens=300, ignore_eos=True)
            )
            stream = stub.Generate(request, timeout=60)
            next(stream)
            for process in [psutil.Process(server.proc.pid), *front_ends(server)]:
                process.send_signal(signal.SIGTERM)
            replies = list(stream)
        assert replies[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert replies[-1].usage.completion_tokens == 300  # (a message may carry several tokens)
        assert server.proc.wait(timeout=60) == 0, server.diagnostics()
    finally:
        server.terminate()
