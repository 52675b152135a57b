"""A server at its file-descriptor limit (issue 7, item 4): under a 1,024-file hard limit, a flood of 1,500
idle connections is capped below the limit, so the server keeps descriptors for its own work (metrics, the
memory probe, callers already connected) while the flood holds its sockets open; it neither spins nor floods
its log, and once the handshake timeout has closed the flood, new callers connect again."""

from __future__ import annotations

import os
import selectors
import socket
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import start_server

FLOOD = 1500


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 10 ms


X = np.ones(512, np.float32)
REQUEST = pb.InferRequest(
    model="mlp",
    inputs=[pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=X.tobytes())],
)


def infer_seconds(stub: pb_grpc.InferenceServiceStub) -> float:
    started = time.monotonic()
    stub.Infer(REQUEST, timeout=30)
    return time.monotonic() - started


@pytest.mark.serial  # compares a bystander's latency against an unloaded one: run alone
def test_an_idle_connection_flood_under_a_1024_file_limit() -> None:
    server = start_server("--models", "mlp", "--handshake-timeout-s", "4", fd_limit=1024)
    flood: list[socket.socket] = []
    connected = grpc.insecure_channel(server.target)
    try:
        bystander = pb_grpc.InferenceServiceStub(connected)
        unloaded = min(infer_seconds(bystander) for _ in range(3))
        cpu_before = cpu_seconds(server.pid)
        for _ in range(FLOOD):  # connect and never speak: no HTTP/2 preface, no request
            flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        # While the flood holds its sockets: a caller already connected is served as usual, and the server
        # still has descriptors of its own (its metrics port accepts a scrape, its memory probe reads /proc).
        assert infer_seconds(bystander) < 5 * unloaded + 0.25
        assert server.metric("sluice_memory_used_bytes") > 0
        open_fds = len(os.listdir(f"/proc/{server.pid}/fd"))
        assert open_fds < 1024 - 128, f"{open_fds} descriptors open: the cap did not hold"
        # The server closes what it cannot hold at once and the rest at the handshake timeout; the flood
        # keeps every socket open on its side meanwhile.
        with selectors.DefaultSelector() as watch:
            for sock in flood:
                watch.register(sock, selectors.EVENT_READ)
            closed: set[int] = set()
            deadline = time.monotonic() + 30
            while len(closed) < FLOOD and time.monotonic() < deadline:
                for key, _ in watch.select(timeout=1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        ended = sock.recv(1) == b""
                    except ConnectionResetError:
                        ended = True
                    if ended:
                        closed.add(sock.fileno())
                        watch.unregister(sock)
        assert len(closed) == FLOOD, f"{len(closed)} of {FLOOD} idle connections closed by the server"
        with grpc.insecure_channel(server.target) as fresh:  # a new caller connects again
            loaded = infer_seconds(pb_grpc.InferenceServiceStub(fresh))
        busy = cpu_seconds(server.pid) - cpu_before
        assert loaded < 5 * unloaded + 0.25, (loaded, unloaded)
        assert busy < 10.0, f"the server burnt {busy:.1f} s of CPU on idle connections"
        assert server.proc.poll() is None
    finally:
        connected.close()
        for sock in flood:
            sock.close()
        code = server.terminate()
    assert code == 0, server.diagnostics()
    assert server.stderr_path is not None
    log = server.stderr_path.read_bytes()
    assert len(log) < 64 * 1024, f"{len(log)} bytes of log: {log[-2000:]!r}"
    for exhausted in (b"Too many open files", b"File descriptor limit reached"):
        assert exhausted not in log, log[-2000:]
