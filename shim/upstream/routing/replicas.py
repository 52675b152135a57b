"""The replicas a routing policy chooses among: per replica one channel of its own, what this shim has in
flight there, how long its calls waited for their first token lately, and whether its readiness says it
takes work.

Load is read without asking per call: the shim counts its own calls in flight to each replica, keeps a
moving average of the time to first token each replica reports in its calls' final message
(GenerateTimings: from arrival to the first token, the queue wait and the prefill), and polls each
replica's `sluice.readiness` health service on an interval (it turns NOT_SERVING when the replica's queue
is full, its memory breaker open, or it drains). The time to first token rather than the queue wait
alone: a replica too short of KV memory to keep its conversations' prefixes, or whose steps are slow (a
busy model), serves its calls without queueing them, and only their first token says it is slow."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sluice.inference.v1 import inference_pb2_grpc

from wire.metadata import READINESS_SERVICE

_log = logging.getLogger("sluice.shim.routing")
_SERVING = health_pb2.HealthCheckResponse.SERVING
# A sample older than this weighs half as much: a replica that was slow and is avoided recovers its
# standing in a minute or two, without new calls to prove it. Longer than the pauses between the calls of
# the conversations a replica holds (users read and type for seconds to tens of seconds): at 5 s a slow
# replica's few remaining conversations found it cleared between their turns, and stayed.
_DECAY_S = 30.0
_WEIGHT = 0.3  # of a new sample in the average


@dataclass(slots=True, eq=False)
class Replica:
    address: str
    channel: grpc.aio.Channel
    inference: inference_pb2_grpc.InferenceServiceAsyncStub
    health: Any  # grpc_health ships no stubs
    in_flight: int = 0
    ready: bool = True  # until a probe says otherwise: a fresh replica is tried, not avoided
    _wait_s: float = 0.0
    _measured_at: float = field(default=0.0)

    def wait(self, now: float) -> float:
        """The moving average of reported times to first token, decayed towards zero while nothing is
        reported."""
        if not self._wait_s:
            return 0.0
        return self._wait_s * float(0.5 ** ((now - self._measured_at) / _DECAY_S))

    def observe(self, seconds: float, now: float) -> None:
        current = self.wait(now)
        self._wait_s = current + _WEIGHT * (seconds - current)
        self._measured_at = now


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
            ready = result is True
            if ready != replica.ready:
                _log.info("replica %s %s", replica.address, "ready" if ready else "not ready")
            replica.ready = ready
        await asyncio.sleep(interval_s)


async def _ready(replica: Replica, timeout_s: float) -> bool:
    request = health_pb2.HealthCheckRequest(service=READINESS_SERVICE)
    with contextlib.suppress(grpc.aio.AioRpcError):
        response = await replica.health.Check(request, timeout=timeout_s)
        return bool(response.status == _SERVING)
    return False


def make_replica(address: str, channel: grpc.aio.Channel) -> Replica:
    return Replica(
        address=address,
        channel=channel,
        inference=inference_pb2_grpc.InferenceServiceStub(channel),
        health=health_pb2_grpc.HealthStub(channel),
    )
