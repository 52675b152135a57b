"""KV events as vLLM publishes them (issue 33, acceptance 3): a subscriber (pyzmq, msgpack) of a live
server's `--kv-events-endpoint` sees a BlockStored for a prompt's blocks, with the prompt's token ids and
the tenant-free salt's empty extra keys, a BlockStored that continues it (its parent the last block's
hash), and a BlockRemoved of those very hashes once other prompts evict them from a small KV cache; the
replay socket resends everything from sequence 0, beginning with AllBlocksCleared."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import grpc
import msgpack
import pytest
import zmq
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, start_server, wait_until

BLOCK = 16
PROMPT = 600  # tokens: two prompts fit the 1,536-token cache below, a third evicts the oldest


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, str]]:
    directory = tmp_path_factory.mktemp("kv-events")
    events, replay = f"ipc://{directory}/events", f"ipc://{directory}/replay"
    process = start_server(
        "--models", "byte-lm", "--kv-cache-bytes", str(1536 * 1024),
        "--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay,
    )  # fmt: skip
    try:
        yield process, events, replay
    finally:
        process.terminate()


def generate(server: ServerProcess, tokens: list[int]) -> None:
    request = pb.GenerateRequest(
        model="byte-lm", token_ids=pb.TokenIds(ids=tokens), sampling=pb.SamplingParams(max_tokens=4)
    )
    with grpc.insecure_channel(server.target) as channel:
        list(pb_grpc.InferenceServiceStub(channel).Generate(request, timeout=60))


def replayed(endpoint: str) -> list[tuple[int, list[Any]]]:
    """Every batch the server still holds, from sequence 0: (sequence, events)."""
    context = zmq.Context.instance()
    with context.socket(zmq.DEALER) as dealer:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big", signed=True)])
        out = []
        while True:
            assert dealer.poll(30_000), "the replay socket did not answer"
            _, number, payload = dealer.recv_multipart()
            sequence = int.from_bytes(number, "big", signed=True)
            if sequence == -1:
                return out
            ts, events = msgpack.unpackb(payload)
            assert isinstance(ts, float)
            out.append((sequence, events))


def test_a_subscriber_sees_blocks_stored_and_removed(server: tuple[ServerProcess, str, str]) -> None:
    process, endpoint, replay = server
    context = zmq.Context.instance()
    with context.socket(zmq.SUB) as sub:
        sub.connect(endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        rng = random.Random(0)
        prompts = [[rng.randrange(256) for _ in range(PROMPT)] for _ in range(4)]
        generate(process, prompts[0])
        for prompt in prompts[1:]:
            generate(process, prompt)
        live: list[list[Any]] = []

        def received() -> bool:  # the live stream: at least the evictions, sent after it joined
            while sub.poll(0):
                topic, _, payload = sub.recv_multipart()
                assert topic.startswith(b"kv@") and topic.endswith(b"@byte-lm")
                live.extend(msgpack.unpackb(payload)[1])
            return any(event[0] == "BlockRemoved" for event in live)

        wait_until(received, what="a BlockRemoved on the live socket")
    batches = replayed(replay)
    assert [s for s, _ in batches] == list(range(len(batches)))  # every one, in order
    events = [event for _, batch in batches for event in batch]
    assert events[0] == ["AllBlocksCleared"]
    stored = [e for e in events if e[0] == "BlockStored"]
    first = stored[0]
    _, hashes, parent, tokens, block_size, lora_id, medium, _, extra = first
    whole = PROMPT // BLOCK * BLOCK  # the prompt's whole blocks (its last token is computed, not cached)
    assert parent is None and block_size == BLOCK and lora_id is None and medium == "CPU"
    assert (
        tokens == prompts[0][: len(tokens)]
        and len(tokens) == BLOCK * len(hashes)
        and len(tokens) >= whole - BLOCK
    )
    assert extra == [None] * len(hashes)  # no tenant: no salt
    of_first = list(hashes)
    for event in stored[1:]:  # the same sequence's later blocks continue the chain
        if event[2] == of_first[-1]:
            of_first += event[1]
    removed = [h for e in events if e[0] == "BlockRemoved" for h in e[1]]
    assert set(of_first) <= set(removed), "the first prompt's blocks were never removed"
