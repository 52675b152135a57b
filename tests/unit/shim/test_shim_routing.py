"""Prefix routing's parts without a server: the prompt's bytes and block hashes (a conversation's next turn
shares the hashes of the turn before; tenants' salts keep them apart), the bounded LRU index, and the rule
that picks a replica (longest match, unless its calls in flight exceed the least's by an absolute and a
relative margin; a new prompt to the least loaded of the replicas not crowded for their KV room, which each
replica's readiness check reports and its calls' cached tokens correct)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from sluice.inference.v1 import inference_pb2 as pb

from shim.config import ShimSettings
from shim.upstream.routing import check_routing, replica_addresses
from shim.upstream.routing.prefix import BALANCED, LEAST_LOADED, PREFIX, PrefixRouting, PrefixRules
from shim.upstream.routing.prefix_index import PrefixIndex, block_hashes, prompt_bytes
from shim.upstream.routing.replicas import Replica

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


async def test_a_calls_timings_count_when_its_end_came_before_its_final_message(
    routing: PrefixRouting,
) -> None:
    # A short answer's status arrives with its final message: the call's done callbacks can run before the
    # consumer reads that message and reports it. The replica's wait must still count it.
    from google.protobuf.duration_pb2 import Duration

    timings = pb.GenerateTimings(queue_wait=Duration(seconds=2))
    call = routing.generate(chat(("user", "a prompt long enough for a block or two")), timeout=5, metadata=())
    chosen = next(r for r in routing.replicas if r.in_flight == 1)
    ended = asyncio.Event()
    call.add_done_callback(lambda _: ended.set())  # after routing's own, which was added first
    call.cancel()
    await asyncio.wait_for(ended.wait(), 10)
    assert chosen.in_flight == 0  # routing's done callback ran
    routing.finished(call, timings)
    assert chosen.wait(time.monotonic()) == pytest.approx(0.6, rel=0.01)  # 0.3 x 2 s
    routing.finished(call, timings)  # read once: a second report of the same call changes nothing
    assert chosen.wait(time.monotonic()) == pytest.approx(0.6, rel=0.01)


def place(routing: PrefixRouting, conversations: int, blocks: int = 10, first: int = 0) -> list[int]:
    """Where new conversations of `blocks` blocks each (numbered from `first`) go on an idle fleet, each
    then held there."""
    chosen = []
    for c in range(first, first + conversations):
        hashes = list(range(1000 * (c + 1), 1000 * (c + 1) + blocks))
        index, reason = routing.choose(hashes)
        assert reason == LEAST_LOADED
        routing.index.record(index, hashes)
        chosen.append(index)
    return chosen


async def test_new_conversations_go_by_the_kv_room_each_replica_reports(routing: PrefixRouting) -> None:
    # Replica 2 reports a twentieth of the others' KV: it is sent about a twentieth of their conversations
    # (which it can keep), not a third that it would evict and prefill again. Before, it was sent 10 of 30.
    for replica, tokens in zip(routing.replicas, (100_000, 100_000, 5_000), strict=True):
        replica.kv_tokens = tokens
    chosen = place(routing, 30)
    assert chosen[:2] == [0, 1]  # idle and empty: the larger KV first
    assert 1 <= chosen.count(2) <= 2 and abs(chosen.count(0) - chosen.count(1)) <= 1
    # Running sequences hold most of replica 1's KV: its room is a tenth, and new conversations go elsewhere.
    routing.replicas[1].kv_usage = 0.9
    assert place(routing, 4, first=30) == [0] * 4
    # A replica that reports no KV size (an older server): rooms count as equal, blocks alone decide.
    routing.replicas[1].kv_usage, routing.replicas[2].kv_tokens = 0.0, 0
    assert place(routing, 3, first=40) == [2, 2, 2]


async def test_a_placement_still_gives_way_to_load_past_both_margins(routing: PrefixRouting) -> None:
    for replica, tokens in zip(routing.replicas, (100_000, 100_000, 5_000), strict=True):
        replica.kv_tokens = tokens
    place(routing, 4)  # 0, 1, 2, and 0 again: replica 2 is now crowded for its room
    routing.replicas[0].in_flight = routing.replicas[1].in_flight = 4  # 3 over replica 2's 0 and past 2x
    assert routing.choose(list(range(7, 17))) == (2, LEAST_LOADED)
    routing.replicas[0].in_flight = routing.replicas[1].in_flight = 2  # 2 over: within the calls' margin
    assert routing.choose(list(range(7, 17)))[0] in (0, 1)


async def test_a_replica_that_lost_what_it_was_sent_gets_fewer_conversations(routing: PrefixRouting) -> None:
    # No KV sizes reported: the calls' usage says replica 0 kept none of the prefixes it was sent for (its
    # cached tokens), so new conversations go to the others until it keeps them again.
    from google.protobuf.duration_pb2 import Duration

    timings = pb.GenerateTimings(queue_wait=Duration(), time_to_first_token=Duration(nanos=10**8))
    words = "a conversation long enough for several blocks of the index to hold it "
    for _ in range(6):
        routing.index.record(0, hashes(chat(("user", words))))
        call = routing.generate(chat(("user", words), ("user", "and?")), timeout=5, metadata=())
        assert routing.replicas[0].in_flight == 1  # sent there for its prefix
        routing.finished(call, timings, pb.Usage(prompt_tokens=100, cached_tokens=0))
        call.cancel()
        await call.code()  # ended: no longer in flight
    assert routing.replicas[0].lost(time.monotonic()) > 0.8
    assert routing.replicas[1].lost(time.monotonic()) == 0
    chosen = place(routing, 12)
    assert chosen.count(0) <= 1 and chosen.count(1) >= 5 and chosen.count(2) >= 5
    # A call that found all it was sent for cached counts as nothing lost: the average falls.
    before = routing.replicas[0].lost(time.monotonic())
    call = routing.generate(chat(("user", words), ("user", "and?")), timeout=5, metadata=())
    routing.finished(call, timings, pb.Usage(prompt_tokens=100, cached_tokens=90))
    call.cancel()
    await call.code()
    assert routing.replicas[0].lost(time.monotonic()) < before


async def test_the_readiness_check_reports_the_replicas_kv_to_the_probe() -> None:
    # The server's readiness answer (a real grpc.aio server with the server's ReportingHealth) carries its
    # KV tokens and use, as its gauges say; the shim's probe reads them (and keeps them where none come).
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from server.metrics import Metrics
    from server.readiness import ReportingHealth
    from shim.upstream.routing.replicas import _ready, make_replica
    from wire.metadata import READINESS_SERVICE

    metrics = Metrics()
    health = ReportingHealth(metrics)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        replica = make_replica(f"127.0.0.1:{port}", channel)
        await health.set(READINESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        assert await _ready(replica, 5) == (True, 0.0, 0.0)  # no Generate model: nothing reported
        metrics.kv_reserved.labels("m").set(1_000)
        metrics.kv_cached.labels("m").set(2_000)
        metrics.kv_free.labels("m").set(5_000)
        assert await _ready(replica, 5) == (True, 8_000.0, pytest.approx(0.125))
        await health.set(READINESS_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await _ready(replica, 5) == (False, 8_000.0, pytest.approx(0.125))
        for gauge in (metrics.kv_reserved, metrics.kv_cached, metrics.kv_free):
            gauge.labels("m").set(0)  # nothing reported: the probe keeps what it last read
        replica.kv_tokens, replica.kv_usage = 8_000.0, 0.125
        assert await _ready(replica, 5) == (False, 8_000.0, 0.125)
    finally:
        await channel.close()
        await server.stop(None)


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
