"""Prefix routing (`--routing prefix`): a Generate call goes to the replica most likely to hold its prompt's
prefix in its prefix cache, unless that replica is loaded past the others by both an absolute and a
relative margin; then to the least loaded. As SGLang's router (`cache_aware`, its `balance_abs_threshold`
and `balance_rel_threshold`) and llm-d's prefix scorer decide, from an approximate index of what this shim
sent each replica (prefix_index.py), without asking the replicas per call.

The rule, per call, among the replicas whose readiness is SERVING (all of them, if none is):
- the prompt's leading blocks each replica was sent: the longest match is the candidate;
- a match under `--routing-min-match` of the prompt's blocks (a new conversation) goes to the least loaded
  replica by expected wait ((calls in flight + 1) x its reported time to first token, replicas.py) among
  those not crowded; equals to the one holding the fewest blocks (it then holds that prefix: the
  conversation's next turns follow it). Blocks are counted per token of KV room each replica's readiness
  reports (its KV tokens less those running sequences hold, times the share of the prefixes it was sent
  for that its calls' usage says it still held; replicas.py; as SGLang's router sends a new prompt to its
  smallest tree, and llm-d's kv-cache-utilization scorer prefers free KV), scaled to the average room:
  crowded is past the least by more than the prompt's blocks and more than
  `--routing-imbalance` times. So a replica with a twentieth of the others' KV is sent about a twentieth of
  their conversations, and keeps their prefixes, instead of a quarter that it evicts and prefills again
  (its calls then the fleet's slowest). The least loaded replica is chosen instead where the one placed
  is loaded past it by both margins below. Where a replica reports no KV size (an older server), the
  replicas' rooms count as equal but for what each lost: blocks alone decide, as before;
- a candidate gives way to the replica with the fewest calls in flight when its own calls in flight exceed
  that least by more than `--routing-imbalance-calls` AND more than `--routing-imbalance` times; or to
  the one whose calls waited least (a moving average of what each call's final message reports: a call
  sent for its prefix, its time to first token; any other, its queue wait) when its own calls' wait
  exceeds that least by more than `--routing-imbalance-wait-s` AND more than `--routing-imbalance` times
  (a replica short of KV memory, that keeps no prefix for long, or a busy one).
  Both margins, as SGLang's balance_abs_threshold and balance_rel_threshold: a ratio alone moved calls
  off their cache whenever two small, noisy figures differed 2x (each step's jitter, the CPU a replica
  gets), and a move costs the whole prompt's prefill, which a few calls' or a fraction of a second's
  wait does not.
The chosen replica is recorded as holding the prompt's blocks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from sluice.inference.v1 import inference_pb2 as pb

from shim.identity import CACHE_SALT, TENANT
from shim.upstream.routing.policy import GenerateCall
from shim.upstream.routing.prefix_index import PrefixIndex, block_hashes, prompt_bytes
from shim.upstream.routing.replicas import Replica, costs, make_replica, probe_readiness

#: Why a call went where it did: the `reason` label of sluice_shim_routed_total.
PREFIX, LEAST_LOADED, BALANCED = "prefix", "least_loaded", "balanced"
_RECORDS = 4096  # calls whose final message may still be read: far more than a shim has running


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixRules:
    block_bytes: int = 64
    index_blocks: int = 65536
    min_match: float = 0.5
    imbalance: float = 2.0
    imbalance_calls: int = 8
    imbalance_wait_s: float = 0.5
    probe_s: float = 1.0
    wait_floor_s: float = 0.05  # times to first token under this are a step's jitter, not load


class PrefixRouting:
    def __init__(
        self,
        addresses: Sequence[str],
        open_channel: Callable[[str], grpc.aio.Channel],
        rules: PrefixRules,
        *,
        routed: Any = None,  # the Counter of calls by replica and reason, when the shim counts them
    ) -> None:
        self.rules = rules
        self.replicas = [make_replica(address, open_channel(address)) for address in addresses]
        self.index = PrefixIndex(len(self.replicas), capacity=rules.index_blocks)
        # By id(call), until finished() reads it: where, why, and the share of its prompt's blocks that
        # replica was sent. Not dropped when the call ends: its end can run before the consumer reads its
        # final message (a short answer's status comes with it), which lost the slow replica's waits and
        # kept its conversations there (test_fleet_routing, under load). The oldest go past _RECORDS (calls
        # that failed before a final message); generate() replaces an id a new call reuses.
        self._replica_of: dict[int, tuple[Replica, str, float]] = {}
        self._routed = routed
        self._probe = asyncio.get_running_loop().create_task(
            probe_readiness(
                self.replicas, interval_s=rules.probe_s, timeout_s=min(max(rules.probe_s, 1.0), 5.0)
            ),
            name="routing readiness",
        )

    def choose(self, hashes: Sequence[int]) -> tuple[int, str]:
        """The replica for a prompt of these block hashes, and why."""
        index, reason, _ = self._choose(hashes)
        return index, reason

    def _choose(self, hashes: Sequence[int]) -> tuple[int, str, int]:
        """choose(), with the blocks of the prompt the chosen replica was sent."""
        live = [i for i, r in enumerate(self.replicas) if r.ready] or list(range(len(self.replicas)))
        cost = costs(self.replicas, live, floor_s=self.rules.wait_floor_s)
        # Ties (equal load, as between idle replicas) go to the replica holding the fewest blocks for its
        # room, as SGLang's router sends a new prompt to its smallest tree: new conversations spread over the
        # fleet instead of piling on the first replica, whose load would then push their next turns away
        # from their cache; then to the larger KV.
        now = time.monotonic()
        fill = self._fills(live, now)
        loads = {i: self.replicas[i].in_flight for i in live}
        waits = {i: self.replicas[i].wait(now) for i in live}

        def placing(i: int) -> tuple[float, int, float, float]:
            return cost[i], loads[i], fill[i], -self.replicas[i].kv_tokens

        cheapest = min(live, key=placing)
        if not hashes:  # nothing for a cache to keep: the least loaded
            return cheapest, LEAST_LOADED, 0
        matched = self.index.matched(hashes)
        best = max(live, key=lambda i: (matched[i], -cost[i]))
        if matched[best] < self.rules.min_match * len(hashes):
            least_fill = min(fill.values())
            roomy = [i for i in live if not self._past(fill[i], least_fill, len(hashes))]
            placed = min(roomy, key=placing)
            if self._past(loads[placed], loads[cheapest], self.rules.imbalance_calls) or self._past(
                waits[placed], waits[cheapest], self.rules.imbalance_wait_s
            ):
                return cheapest, LEAST_LOADED, matched[cheapest]
            return placed, LEAST_LOADED, matched[placed]
        least = min(live, key=lambda i: (loads[i], cost[i], fill[i]))
        if self._past(loads[best], loads[least], self.rules.imbalance_calls):
            return least, BALANCED, matched[least]
        quickest = min(live, key=lambda i: (waits[i], loads[i], fill[i]))
        if self._past(waits[best], waits[quickest], self.rules.imbalance_wait_s):
            return quickest, BALANCED, matched[quickest]
        return best, PREFIX, matched[best]

    def _fills(self, live: list[int], now: float) -> dict[int, float]:
        """Each live replica's indexed blocks per unit of its room (replicas.py), scaled to the live
        replicas' average room: in blocks, as if each were of average size. Sizes count where every live
        replica reports its KV tokens; otherwise rooms are equal but for what each lost lately."""
        sized = all(self.replicas[i].kv_tokens > 0 for i in live)
        rooms = {i: self.replicas[i].room(now, sized=sized) for i in live}
        mean = sum(rooms.values()) / len(rooms)
        return {i: self.index.size(i) * mean / rooms[i] for i in live}

    def _past(self, value: float, least: float, margin: float) -> bool:
        """Loaded past both margins: by more than `margin`, and more than --routing-imbalance times."""
        return value - least > margin and value > self.rules.imbalance * least

    def generate(
        self, request: pb.GenerateRequest, *, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> GenerateCall:
        salt = CACHE_SALT.get() or TENANT.get() or ""
        hashes = block_hashes(
            prompt_bytes(request), block_bytes=self.rules.block_bytes, seed=f"{request.model}\0{salt}"
        )
        index, reason, matched = self._choose(hashes)
        self.index.record(index, hashes)
        replica = self.replicas[index]
        if self._routed is not None:
            self._routed.labels(replica.address, reason).inc()
        call: GenerateCall = replica.inference.Generate(request, timeout=timeout, metadata=metadata)
        replica.in_flight += 1
        self._replica_of.pop(id(call), None)  # an id a finished call had: the new one goes last
        self._replica_of[id(call)] = replica, reason, matched / len(hashes) if hashes else 0.0
        if len(self._replica_of) > _RECORDS:
            del self._replica_of[next(iter(self._replica_of))]

        def done(_: object) -> None:
            replica.in_flight -= 1

        call.add_done_callback(done)
        return call

    def finished(
        self, call: GenerateCall, timings: pb.GenerateTimings, usage: pb.Usage | None = None
    ) -> None:
        """The replica's wait beyond the prefill routing chose: a call sent for its prefix reports its time
        to first token (a replica that lost the prefix, or a busy one, is slow to it); any other call only
        its queue wait, since its whole prompt's prefill is routing's doing (counted, a move's prefill
        made its new replica look slow, and moved that one's calls in turn: 256 of 512 in a run). A call
        sent for its prefix also says, by its usage's cached tokens, how much of it the replica still held:
        one that evicts what it is sent is given fewer new conversations (choose's room)."""
        where = self._replica_of.pop(id(call), None)
        if where is None:
            return
        replica, reason, expected = where
        now = time.monotonic()
        if reason == PREFIX and usage is not None and usage.prompt_tokens > 0 and expected > 0:
            replica.observe_lost(1.0 - usage.cached_tokens / usage.prompt_tokens / expected, now)
        if reason == PREFIX and timings.HasField("time_to_first_token"):
            waited = timings.time_to_first_token
        elif reason != PREFIX and timings.HasField("queue_wait"):
            waited = timings.queue_wait
        else:
            return
        replica.observe(waited.ToTimedelta().total_seconds(), now)

    async def close(self) -> None:
        self._probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._probe
        for replica in self.replicas:
            await replica.channel.close(grace=None)
