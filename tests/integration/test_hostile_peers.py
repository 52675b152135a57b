"""Peers that read slowly or never, over raw HTTP/2 (issue 7, items 2 and 13): a stream whose peer grants
no flow-control window ends on the server and frees its admission slot while the peer keeps its socket
open, and a drain still reaches peers that read slowly."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.h2peer import H2Peer
from tests.support.processes import ServerProcess, start_server, wait_until

SLOTS = 8


def generate(max_tokens: int, seed: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        model="byte-lm",
        text="never read",
        sampling=pb.SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True),
    )


def bystander_seconds(server: ServerProcess) -> float:
    """One ordinary 32-token stream, read as fast as it comes."""
    with grpc.insecure_channel(server.target) as channel:
        started = time.monotonic()
        replies = list(pb_grpc.InferenceServiceStub(channel).Generate(generate(32, 1), timeout=30))
        assert replies[-1].finish_reason == pb.FINISH_REASON_LENGTH
        return time.monotonic() - started


def reason_of(trailers: dict[str, str]) -> str:
    status = status_pb2.Status.FromString(base64.b64decode(trailers["grpc-status-details-bin"] + "=="))
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info.reason


@pytest.fixture(scope="module")
def stall_server() -> Iterator[ServerProcess]:
    server = start_server(
        "--models", "byte-lm",
        "--max-sequences", str(SLOTS),
        "--max-queue", "8",
        "--stall-timeout-s", "1",
    )  # fmt: skip
    yield server
    assert server.terminate() == 0, server.diagnostics()


@pytest.mark.serial  # compares a bystander's latency against an unloaded one: run alone
def test_a_peer_granting_no_window_loses_its_slots_while_it_holds_the_socket(
    stall_server: ServerProcess,
) -> None:
    server = stall_server
    unloaded = min(bystander_seconds(server) for _ in range(3))
    stalled_before = server.metric("sluice_streams_write_stalled_total")
    peer = H2Peer(server.port, window=1024)
    try:
        # More streams than slots: 8 are admitted and stall on the 1 KiB window, 4 queue behind them.
        streams = [peer.generate(generate(900, i)) for i in range(SLOTS + 4)]
        wait_until(
            lambda: server.metric("sluice_streams_write_stalled_total") - stalled_before >= SLOTS + 4,
            timeout=60,
            what="every stream of the silent peer ended by the write watchdog",
        )
        wait_until(
            lambda: (
                server.metric("sluice_requests_in_flight", method="Generate") == 0
                and server.metric("sluice_requests_waiting", method="Generate") == 0
            ),
            what="the silent peer's slots given back",
        )
        assert not peer.closed and not any(s.ended for s in streams)  # the peer still holds them open
        # The attack goes on (the socket stays open, its streams unread); a bystander is served as usual.
        loaded = bystander_seconds(server)
        assert loaded < 3 * unloaded + 0.5, (loaded, unloaded)
        assert server.metric("sluice_kv_slots_in_use") == 0
        # A peer that reads again receives what was held back, then the documented status.
        for stream in streams:
            peer.widen(stream, 1 << 20)
        peer.wait(lambda: all(s.ended for s in streams), timeout=30, what="the queued statuses")
        for stream in streams:
            assert stream.trailers is not None, stream
            assert stream.trailers["grpc-status"] == str(grpc.StatusCode.CANCELLED.value[0]), stream.trailers
            assert reason_of(stream.trailers) == "STALLED_CONSUMER"
        # The calls ended after their slots were given back: nothing is given back twice.
        assert server.metric("sluice_requests_in_flight", method="Generate") == 0
    finally:
        peer.close()
    assert server.proc.poll() is None


def test_a_drain_reaches_peers_that_read_slowly() -> None:
    """SIGTERM while six streams crawl through a 256-byte window at ~100 bytes/s each: every one still gets
    its final SHUTTING_DOWN message and an OK status before the server exits (with a final message sent
    half a second before the end of the grace period, about one stream in two was reset instead)."""
    server = start_server("--models", "byte-lm", "--max-sequences", "8", "--grace-s", "8")
    peer = H2Peer(server.port, window=256)
    try:
        streams = [peer.generate(generate(900, i)) for i in range(6)]
        peer.wait(lambda: all(s.received >= 256 for s in streams), timeout=30, what="every stream started")
        server.proc.send_signal(15)
        deadline = time.monotonic() + 30
        while not all(s.ended for s in streams) and time.monotonic() < deadline:
            for stream in streams:
                peer.grant(stream, 10)
            time.sleep(0.1)  # the pace of the slow reader itself, not a wait for a condition
        assert server.proc.wait(timeout=30) == 0, server.diagnostics()
    finally:
        peer.close()
        server.terminate()
    for stream in streams:
        assert stream.trailers is not None and stream.trailers["grpc-status"] == "0", (
            stream.reset,
            stream.trailers,
        )
        final = stream.messages()[-1]
        assert final.finish_reason == pb.FINISH_REASON_CANCELLED, final
        assert final.error.reason == "SHUTTING_DOWN", final
