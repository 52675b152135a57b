"""Prefix routing's parts without a server: the prompt's bytes and block hashes (a conversation's next turn
shares the hashes of the turn before; tenants' salts keep them apart), the bounded LRU index, and the rule
that picks a replica (longest match, unless its calls in flight exceed the least's by an absolute and a
relative margin; a new prompt to the least loaded)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import pytest
from sluice.inference.v1 import inference_pb2 as pb

from shim.config import ShimSettings
from shim.upstream.routing import check_routing, replica_addresses
from shim.upstream.routing.prefix import BALANCED, LEAST_LOADED, PREFIX, PrefixRouting, PrefixRules
from shim.upstream.routing.prefix_index import PrefixIndex, block_hashes, prompt_bytes

pytestmark = pytest.mark.anyio


def chat(*turns: tuple[str, str]) -> pb.GenerateRequest:
    messages = [pb.ChatMessage(role=role, content=content) for role, content in turns]
    return pb.GenerateRequest(model="byte-lm", chat=pb.ChatPrompt(messages=messages))


def hashes(request: pb.GenerateRequest, salt: str = "") -> list[int]:
    return block_hashes(prompt_bytes(request), block_bytes=16, seed=f"{request.model}\0{salt}")


def test_a_next_turn_shares_the_hashes_of_the_turn_before() -> None:
    first = chat(("system", "be brief " * 8), ("user", "what is a sluice? " * 4))
    second = chat(("system", "be brief " * 8), ("user", "what is a sluice? " * 4), ("assistant", "a gate"),
                  ("user", "and a weir?"))  # fmt: skip
    a, b = hashes(first), hashes(second)
    assert len(a) >= 8 and len(b) > len(a)
    assert b[: len(a) - 1] == a[: len(a) - 1]  # the last whole block of the first may end mid-turn
    assert hashes(chat(("user", "x" * 64)))[0] != hashes(chat(("system", "x" * 64)))[0]


def test_a_huge_prompt_is_indexed_by_its_first_blocks_only() -> None:
    huge = block_hashes(b"x" * (1 << 20), block_bytes=64, seed="s")
    assert len(huge) == 4096 and huge == block_hashes(b"x" * (1 << 19), block_bytes=64, seed="s")


def test_tenants_salts_keep_equal_prompts_apart() -> None:
    request = chat(("user", "the same words " * 10))
    assert hashes(request, "tenant:a") != hashes(request, "tenant:b")
    assert hashes(request, "tenant:a") == hashes(request, "tenant:a")
    text = pb.GenerateRequest(model="byte-lm", text="abc" * 40)
    ids = pb.GenerateRequest(model="byte-lm", token_ids=pb.TokenIds(ids=list(range(40))))
    assert hashes(text) and hashes(ids) and hashes(pb.GenerateRequest(model="byte-lm")) == []


def test_the_index_matches_leading_blocks_and_forgets_the_oldest() -> None:
    index = PrefixIndex(2, capacity=10)
    index.record(0, [1, 2, 3, 4])
    index.record(1, [1, 2])
    assert index.matched([1, 2, 3, 9]) == [3, 2]
    assert index.matched([9, 2, 3]) == [0, 0]  # a chain: nothing after the first miss counts
    index.record(0, list(range(100, 108)))  # 12 > 10: blocks 1 and 2 go, the oldest
    assert index.size(0) == 10 and index.matched([1, 2, 3]) == [0, 2]
    index.record(0, [3])  # sent again: now the most recent
    index.record(0, [200, 201])
    assert index.matched([3]) == [1, 0]
    with pytest.raises(ValueError, match="capacity"):
        PrefixIndex(1, capacity=0)


@pytest.fixture
async def routing() -> AsyncIterator[PrefixRouting]:
    # Addresses nobody listens on: channels connect lazily, and the rule is tested without calls.
    router = PrefixRouting(
        ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"],
        lambda address: grpc.aio.insecure_channel(address),
        PrefixRules(
            block_bytes=16,
            imbalance=2.0,
            imbalance_calls=2,
            imbalance_wait_s=0.5,
            min_match=0.5,
            probe_s=3600,
        ),
    )
    router._probe.cancel()  # readiness is set by hand here
    try:
        for replica in router.replicas:
            replica.ready = True
        yield router
    finally:
        await router.close()


async def test_the_longest_match_wins_unless_loaded_past_both_margins(routing: PrefixRouting) -> None:
    prompt = list(range(10))
    routing.index.record(2, prompt[:8])
    routing.index.record(1, prompt[:3])
    assert routing.choose(prompt) == (2, PREFIX)
    replicas = routing.replicas

    def in_flight(*counts: int) -> tuple[int, str]:
        for replica, count in zip(replicas, counts, strict=True):
            replica.in_flight = count
        return routing.choose(prompt)

    assert in_flight(0, 0, 3) == (0, BALANCED)  # 3 over the least's 0: past 2 calls and past 2x
    assert in_flight(1, 1, 3) == (2, PREFIX)  # 2 over: not past the absolute margin
    assert in_flight(4, 5, 10) == (0, BALANCED)  # 6 over and 2.5x
    assert in_flight(6, 7, 10) == (2, PREFIX)  # 4 over, but 10 is not past 2 x 6: the relative margin holds
    assert in_flight(7, 4, 10) == (1, BALANCED)  # to the fewest calls in flight
    # Reported times to first token move a call past both margins too (0.5 s and 2x), not on jitter.
    in_flight(1, 1, 1)
    now = time.monotonic()
    replicas[2].observe(1.0, now)  # its average: 0.3 s
    replicas[0].observe(0.01, now)
    assert routing.choose(prompt) == (2, PREFIX)  # 0.3 s against 0: within the absolute margin
    replicas[2].observe(4.0, now)  # 1.41 s: past 0.5 s more and 2x the least (replica 1's 0)
    assert routing.choose(prompt) == (1, BALANCED)
    replicas[1].observe(2.0, now)  # 0.6 s; the least is now replica 0's 0.003 s
    assert routing.choose(prompt) == (0, BALANCED)
    for replica in replicas[:2]:
        replica.observe(10.0, now)  # every replica is slow: 1.41 s is within 2x of the least
    assert routing.choose(prompt) == (2, PREFIX)


async def test_a_slow_replicas_calls_pile_up_and_its_conversations_move(routing: PrefixRouting) -> None:
    # Replica 0 holds five conversations; its calls take longer, so they stay in flight and pile up: once
    # they pass both margins, its conversations' next turns go where the fewest calls are.
    conversations = [list(range(100 * c, 100 * c + 8)) for c in range(5)]
    for hashes in conversations:
        routing.index.record(0, hashes)
    routing.replicas[1].in_flight = routing.replicas[2].in_flight = 1
    chosen = []
    for hashes in conversations:
        index, reason = routing.choose([*hashes, 999])
        routing.replicas[index].in_flight += 1  # none of them finishes
        chosen.append((index, reason))
    assert chosen[:4] == [(0, PREFIX)] * 4 and chosen[4] == (1, BALANCED)


async def test_a_new_prompt_goes_to_the_least_loaded_ready_replica(routing: PrefixRouting) -> None:
    routing.index.record(0, [1, 2, 3, 4])
    routing.replicas[0].in_flight = 3
    routing.replicas[1].in_flight = 1
    assert routing.choose([1, 50, 51, 52]) == (2, LEAST_LOADED)  # 1 of 4 blocks: under min_match
    assert routing.choose([]) == (2, LEAST_LOADED)
    routing.replicas[2].ready = False
    assert routing.choose([7]) == (1, LEAST_LOADED)
    for replica in routing.replicas:
        replica.ready = False  # none ready: every replica stays a candidate, the calls say why
    assert routing.choose([7]) == (2, LEAST_LOADED)


async def test_new_prompts_on_idle_replicas_spread_over_them(routing: PrefixRouting) -> None:
    # Three conversations start on an idle fleet: each goes to the replica holding the fewest blocks (as
    # SGLang's smallest tree), not all to the first replica.
    chosen = []
    for start in (100, 200, 300):
        hashes = list(range(start, start + 4))
        index, reason = routing.choose(hashes)
        routing.index.record(index, hashes)
        chosen.append((index, reason))
    assert sorted(i for i, _ in chosen) == [0, 1, 2] and {r for _, r in chosen} == {LEAST_LOADED}


def test_the_wait_average_moves_and_decays() -> None:
    from shim.upstream.routing.replicas import Replica

    replica = Replica("127.0.0.1:1", None, None, None)  # type: ignore[arg-type]  # no call is made
    assert replica.wait(100.0) == 0.0
    replica.observe(1.0, 100.0)
    assert replica.wait(100.0) == pytest.approx(0.3)
    replica.observe(1.0, 100.0)
    assert replica.wait(100.0) == pytest.approx(0.51)
    assert replica.wait(130.0) == pytest.approx(0.255)  # half after 30 s with nothing reported


async def test_a_call_sent_for_its_prefix_reports_its_time_to_first_token(routing: PrefixRouting) -> None:
    # A new prompt (least loaded) counts only its queue wait: its whole prefill is routing's choice, and
    # counted, a move's prefill would make its new replica look slow. Its next turn, sent for its prefix,
    # counts its time to first token: a replica that lost the prefix (or a busy one) is slow to it.
    from google.protobuf.duration_pb2 import Duration

    timings = pb.GenerateTimings(queue_wait=Duration(seconds=1), time_to_first_token=Duration(seconds=3))
    first = chat(("user", "a prompt long enough for a block or two, or three of them"))
    call = routing.generate(first, timeout=5, metadata=())
    chosen = next(r for r in routing.replicas if r.in_flight == 1)
    routing.finished(call, timings)
    assert chosen.wait(time.monotonic()) == pytest.approx(0.3, rel=0.01)  # 0.3 x 1 s
    call.cancel()
    second = chat(("user", "a prompt long enough for a block or two, or three of them"), ("user", "and?"))
    call = routing.generate(second, timeout=5, metadata=())
    assert chosen.in_flight >= 1  # it followed its prefix
    routing.finished(call, timings)
    assert chosen.wait(time.monotonic()) == pytest.approx(0.3 + 0.3 * 2.7, rel=0.01)
    call.cancel()


def test_prefix_routing_needs_replicas_it_can_name() -> None:
    assert replica_addresses("127.0.0.1:5,127.0.0.1:6") == ["127.0.0.1:5", "127.0.0.1:6"]
    assert replica_addresses("[::1]:5,[::1]:6") == ["[::1]:5", "[::1]:6"]
    assert replica_addresses("localhost:5") == ["localhost:5"]
    for target in ("dns:///sluice:50051", "unix:/tmp/s.sock"):
        with pytest.raises(ValueError, match="routing prefix"):
            check_routing(ShimSettings(upstream=target, routing="prefix"))
    check_routing(ShimSettings(upstream="dns:///sluice:50051"))
    with pytest.raises(ValueError, match="invalid setting routing"):
        check_routing(ShimSettings(routing="random"))
    with pytest.raises(ValueError, match="routing_imbalance"):
        ShimSettings(routing_imbalance=0.5)
    with pytest.raises(ValueError, match="routing_imbalance_calls"):
        ShimSettings(routing_imbalance_calls=-1)
    with pytest.raises(ValueError, match="routing_imbalance_wait_s"):
        ShimSettings(routing_imbalance_wait_s=-0.1)
