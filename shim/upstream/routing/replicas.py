"""The replicas a routing policy chooses among: per replica one channel of its own, what this shim has in
flight there, how long its calls waited for their first token lately, and whether its readiness says it
takes work.

Load is read without asking per call: the shim counts its own calls in flight to each replica, keeps a
moving average of the time to first token each replica reports in its calls' final message
(GenerateTimings: from arrival to the first token, the queue wait and the prefill), and polls each
replica's `sluice.readiness` health service on an interval (it turns NOT_SERVING when the replica's queue
is full, its memory breaker open, or it drains). The time to first token rather than the queue wait
alone: a replica too short of KV memory to keep its conversations' prefixes, or whose steps are slow (a
busy model), serves its calls without queueing them, and only their first token says it is slow. So the
readiness poll also reads what each answer's trailing metadata says of the replica's KV caches (their
tokens in all, and the fraction running sequences hold; server/readiness.py): how much of its
conversations' prefixes a replica can keep is known before its calls show it, and new conversations are
placed by it (prefix.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sluice.inference.v1 import inference_pb2_grpc

from wire.metadata import KV_TOKENS, KV_USAGE, READINESS_SERVICE

_log = logging.getLogger("sluice.shim.routing")
_SERVING = health_pb2.HealthCheckResponse.SERVING
# A sample older than this weighs half as much: a replica that was slow and is avoided recovers its
# standing in a minute or two, without new calls to prove it. Longer than the pauses between the calls of
# the conversations a replica holds (users read and type for seconds to tens of seconds): at 5 s a slow
# replica's few remaining conversations found it cleared between their turns, and stayed.
_DECAY_S = 30.0
_WEIGHT = 0.3  # of a new sample in the average


@dataclass(slots=True)
class Decaying:
    """A moving average of samples that decays towards zero while none come (half every _DECAY_S)."""

    value: float = 0.0
    at: float = 0.0

    def now(self, now: float) -> float:
        return self.value * float(0.5 ** ((now - self.at) / _DECAY_S)) if self.value else 0.0

    def add(self, sample: float, now: float) -> None:
        current = self.now(now)
        self.value, self.at = current + _WEIGHT * (sample - current), now


@dataclass(slots=True, eq=False)
class Replica:
    address: str
    channel: grpc.aio.Channel
    inference: inference_pb2_grpc.InferenceServiceAsyncStub
    health: Any  # grpc_health ships no stubs
    in_flight: int = 0
    ready: bool = True  # until a probe says otherwise: a fresh replica is tried, not avoided
    kv_tokens: float = 0.0  # its KV caches' tokens, as its readiness reports them (0: not reported)
    kv_usage: float = 0.0  # the fraction of them running sequences hold
    _wait: Decaying = field(default_factory=Decaying)  # seconds to the first token
    _lost: Decaying = field(default_factory=Decaying)  # the fraction of an expected prefix it no longer held

    def wait(self, now: float) -> float:
        """The moving average of reported times to first token, decayed towards zero while nothing is
        reported."""
        return self._wait.now(now)

    def observe(self, seconds: float, now: float) -> None:
        self._wait.add(seconds, now)

    def lost(self, now: float) -> float:
        """The moving average of the share of the prefix a call was sent here for that the replica no longer
        held (its usage's cached tokens fell short): it evicts what it is sent (too little KV for its
        conversations, or room taken by others' calls); decays towards none."""
        return self._lost.now(now)

    def observe_lost(self, fraction: float, now: float) -> None:
        self._lost.add(min(max(fraction, 0.0), 1.0), now)

    def room(self, now: float, *, sized: bool) -> float:
        """The relative room it has to keep conversations' prefixes: its KV tokens not held by running
        sequences (where `sized`: every replica compared reports its size; else 1), times the share of
        what it was sent that it kept lately."""
        tokens = self.kv_tokens * (1.0 - self.kv_usage) if sized else 1.0
        kept = max(1.0 - self.lost(now), 0.05)  # one that kept nothing still holds what it was sent last
        return max(tokens, 1.0) * kept


def costs(replicas: list[Replica], live: list[int], *, floor_s: float) -> dict[int, float]:
    """Each live replica's expected wait: (calls in flight + 1) x its time to first token, times under
    `floor_s` counted as `floor_s` (a few steps' jitter is not load: then calls in flight alone decide)."""
    now = time.monotonic()
    return {i: (replicas[i].in_flight + 1) * max(replicas[i].wait(now), floor_s) for i in live}


async def probe_readiness(replicas: list[Replica], *, interval_s: float, timeout_s: float) -> None:
    """Forever: each replica's readiness every `interval_s`; a failed check counts as not ready."""
    while True:
        results = await asyncio.gather(
            *(_ready(replica, timeout_s) for replica in replicas), return_exceptions=True
        )
        for replica, result in zip(replicas, results, strict=True):
            ready = isinstance(result, tuple) and result[0]
            if isinstance(result, tuple):
                replica.kv_tokens, replica.kv_usage = result[1], result[2]
            if ready != replica.ready:
                _log.info("replica %s %s", replica.address, "ready" if ready else "not ready")
            replica.ready = ready
        await asyncio.sleep(interval_s)


async def _ready(replica: Replica, timeout_s: float) -> tuple[bool, float, float] | None:
    """Whether the replica is SERVING, with its KV tokens and use (kept as they were where not reported:
    a server from before this reports none); None where the check failed."""
    request = health_pb2.HealthCheckRequest(service=READINESS_SERVICE)
    with contextlib.suppress(grpc.aio.AioRpcError):
        call = replica.health.Check(request, timeout=timeout_s)
        response = await call
        reported = dict(await call.trailing_metadata() or ())
        tokens, usage = replica.kv_tokens, replica.kv_usage
        with contextlib.suppress(KeyError, ValueError, TypeError):
            read = float(reported[KV_TOKENS]), float(reported[KV_USAGE])
            if all(math.isfinite(x) for x in read) and read[0] >= 0:  # a garbled report changes nothing
                tokens, usage = read[0], min(max(read[1], 0.0), 1.0)
        return bool(response.status == _SERVING), tokens, usage
    return None


def make_replica(address: str, channel: grpc.aio.Channel) -> Replica:
    return Replica(
        address=address,
        channel=channel,
        inference=inference_pb2_grpc.InferenceServiceStub(channel),
        health=health_pb2_grpc.HealthStub(channel),
    )
