"""One stalled peer cannot lock short-deadline Generate calls out (issue 23, item 2). A peer opens 32
Generate streams on one connection (1,000 tokens each) with a 1 KiB window it never replenishes, while it
reads the socket and answers pings. The streams' admission slots come back with their KV slots, not a stall
timeout later, and a 2-token Generate with a 3 s deadline is served the moment capacity is free, and after
the peer has gone.

Before, the gate learnt the stalled streams' hold time (two stall timeouts, over the bystander's deadline)
as Generate's service time, and with nothing else admitted never unlearnt it: every such call was refused
DEADLINE_EXCEEDED "the estimated wait plus service time is ..." for good. Slow SSE readers through the shim
are the same case from HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.h2peer import H2Peer
from tests.support.processes import ServerProcess, start_server, start_shim, wait_until

STREAMS = 32
STALL_S = 2.0  # the watchdog ends an unwritable stream after twice this: 4 s, over the deadline below
DEADLINE_S = 3.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = start_server(
        "--models", "byte-lm,mlp",
        "--max-sequences", str(STREAMS),
        "--max-queue", "8",
        "--stall-timeout-s", str(STALL_S),
    )  # fmt: skip
    yield proc
    assert proc.terminate() == 0, proc.diagnostics()


def short_generate(server: ServerProcess) -> pb.GenerateResponse:
    """The bystander: 2 tokens with a 3 s deadline, on a connection of its own."""
    with grpc.insecure_channel(server.target) as channel:
        request = pb.GenerateRequest(
            model="byte-lm", text="probe", sampling=pb.SamplingParams(max_tokens=2, seed=1, ignore_eos=True)
        )
        replies = list(pb_grpc.InferenceServiceStub(channel).Generate(request, timeout=DEADLINE_S))
    assert replies[-1].finish_reason == pb.FINISH_REASON_LENGTH, replies[-1]
    return replies[-1]


def short_infer(server: ServerProcess) -> None:
    x = np.ones(512, dtype=np.float32).tobytes()
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x)
    with grpc.insecure_channel(server.target) as channel:
        pb_grpc.InferenceServiceStub(channel).Infer(
            pb.InferRequest(model="mlp", inputs=[tensor]), timeout=DEADLINE_S
        )


def generate_idle(server: ServerProcess) -> bool:
    return (
        server.metric("sluice_kv_slots_in_use", model="byte-lm") == 0
        and server.metric("sluice_requests_in_flight", method="Generate") == 0
        and server.metric("sluice_requests_waiting", method="Generate") == 0
    )


def test_a_stalled_peer_does_not_lock_short_deadlines_out(server: ServerProcess) -> None:
    short_generate(server)  # the decode rate is measured before the attack
    peer = H2Peer(server.port, window=1024)
    try:
        for i in range(STREAMS):
            peer.generate(
                pb.GenerateRequest(
                    model="byte-lm",
                    text="never read",
                    sampling=pb.SamplingParams(max_tokens=1000, seed=i, ignore_eos=True),
                )
            )
        wait_until(
            lambda: server.metric("sluice_kv_slots_in_use", model="byte-lm") == STREAMS,
            timeout=30,
            what="every stream of the stalled peer holding a KV slot",
        )
        # The scheduler ends the stalled streams after STALL_S: the admission slots come back with the KV
        # slots (the gauges are published together, after the slots are freed), not one watchdog later.
        wait_until(
            lambda: server.metric("sluice_kv_slots_in_use", model="byte-lm") == 0,
            timeout=30,
            what="the stalled streams' KV slots freed",
        )
        assert server.metric("sluice_requests_in_flight", method="Generate") == 0
        short_generate(server)  # capacity is free: served, while the peer still holds its streams
        short_infer(server)
        assert not peer.closed
    finally:
        peer.close()
    wait_until(lambda: generate_idle(server), timeout=30, what="nothing in flight")
    for _ in range(5):  # and it stays so: the estimate learnt nothing from the stalled streams
        short_generate(server)
    short_infer(server)


def test_slow_sse_readers_through_the_shim_do_not_lock_short_deadlines_out(server: ServerProcess) -> None:
    shim = start_shim(server.target)
    readers: list[socket.socket] = []
    try:
        body = (
            b'{"model": "byte-lm", "prompt": "slow", "max_tokens": 1000, "stream": true, "seed": 3,'
            b' "ignore_eos": true}'
        )
        request = (
            b"POST /v1/generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        for _ in range(20):
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # set before connect: a small window
            reader.connect(("127.0.0.1", shim.port))
            reader.sendall(request)
            readers.append(reader)
        for reader in readers:  # every reader started; then they read nothing
            reader.settimeout(30)
            assert reader.recv(64).startswith(b"HTTP/1.1 200")
        wait_until(lambda: generate_idle(server), timeout=60, what="the slow readers' server capacity free")
        short_generate(server)
    finally:
        for reader in readers:
            reader.close()
        shim.terminate()
    wait_until(lambda: generate_idle(server), timeout=30, what="nothing in flight")
    for _ in range(5):  # each within its own 3 s deadline, or short_generate raises
        short_generate(server)
