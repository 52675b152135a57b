"""Prefix routing (`--routing prefix`): a Generate call goes to the replica most likely to hold its prompt's
prefix in its prefix cache, unless that replica is loaded past the others by both an absolute and a
relative margin; then to the least loaded. As SGLang's router (`cache_aware`, its `balance_abs_threshold`
and `balance_rel_threshold`) and llm-d's prefix scorer decide, from an approximate index of what this shim
sent each replica (prefix_index.py), without asking the replicas per call.

The rule, per call, among the replicas whose readiness is SERVING (all of them, if none is):
- the prompt's leading blocks each replica was sent: the longest match is the candidate;
- a match under `--routing-min-match` of the prompt's blocks (a new conversation) goes to the least loaded
  replica by expected wait ((calls in flight + 1) x its reported time to first token, replicas.py); equals
  to the one holding the fewest blocks (it then holds that prefix: the conversation's next turns follow it);
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
        self._replica_of: dict[int, tuple[Replica, str]] = {}  # by id(call), while it runs: where, and why
        self._routed = routed
        self._probe = asyncio.get_running_loop().create_task(
            probe_readiness(
                self.replicas, interval_s=rules.probe_s, timeout_s=min(max(rules.probe_s, 1.0), 5.0)
            ),
            name="routing readiness",
        )

    def choose(self, hashes: Sequence[int]) -> tuple[int, str]:
        """The replica for a prompt of these block hashes, and why."""
        live = [i for i, r in enumerate(self.replicas) if r.ready] or list(range(len(self.replicas)))
        cost = costs(self.replicas, live, floor_s=self.rules.wait_floor_s)
        # Ties (equal load, as between idle replicas) go to the replica holding the fewest blocks, as SGLang's
        # router sends a new prompt to its smallest tree: new conversations spread over the fleet instead of
        # piling on the first replica, whose load would then push their next turns away from their cache.
        cheapest = min(live, key=lambda i: (cost[i], self.replicas[i].in_flight, self.index.size(i)))
        if not hashes:
            return cheapest, LEAST_LOADED
        matched = self.index.matched(hashes)
        best = max(live, key=lambda i: (matched[i], -cost[i]))
        if matched[best] < self.rules.min_match * len(hashes):
            return cheapest, LEAST_LOADED
        loads = {i: self.replicas[i].in_flight for i in live}
        least = min(live, key=lambda i: (loads[i], cost[i], self.index.size(i)))
        if self._past(loads[best], loads[least], self.rules.imbalance_calls):
            return least, BALANCED
        now = time.monotonic()
        waits = {i: self.replicas[i].wait(now) for i in live}
        quickest = min(live, key=lambda i: (waits[i], loads[i], self.index.size(i)))
        if self._past(waits[best], waits[quickest], self.rules.imbalance_wait_s):
            return quickest, BALANCED
        return best, PREFIX

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
        index, reason = self.choose(hashes)
        self.index.record(index, hashes)
        replica = self.replicas[index]
        if self._routed is not None:
            self._routed.labels(replica.address, reason).inc()
        call: GenerateCall = replica.inference.Generate(request, timeout=timeout, metadata=metadata)
        replica.in_flight += 1
        self._replica_of[id(call)] = replica, reason

        def done(_: object) -> None:
            replica.in_flight -= 1
            self._replica_of.pop(id(call), None)

        call.add_done_callback(done)
        return call

    def finished(self, call: GenerateCall, timings: pb.GenerateTimings) -> None:
        """The replica's wait beyond the prefill routing chose: a call sent for its prefix reports its time
        to first token (a replica that lost the prefix, or a busy one, is slow to it); any other call only
        its queue wait, since its whole prompt's prefill is routing's doing (counted, a move's prefill
        made its new replica look slow, and moved that one's calls in turn: 256 of 512 in a run)."""
        where = self._replica_of.get(id(call))
        if where is None:
            return
        replica, reason = where
        if reason == PREFIX and timings.HasField("time_to_first_token"):
            waited = timings.time_to_first_token
        elif reason != PREFIX and timings.HasField("queue_wait"):
            waited = timings.queue_wait
        else:
            return
        replica.observe(waited.ToTimedelta().total_seconds(), time.monotonic())

    async def close(self) -> None:
        self._probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._probe
        for replica in self.replicas:
            await replica.channel.close(grace=None)
