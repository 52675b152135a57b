"""Experiment A, the disconnect storm: many Generate streams at once, some of whose callers leave early
(half by gRPC cancel, half by closing the SSE connection); how many tokens were computed that nobody saw."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import httpx
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.stack import SluiceServer, SluiceShim
from bench.storm_clients import CALL_TIMEOUT_S, Caller, grpc_caller, sse_caller
from bench.storm_server import counter, wait_idle


@dataclass(frozen=True)
class StormResult:
    streams: int
    leavers: int
    total: float  # sluice_tokens_generated_total during the storm
    discarded: float
    after_cancel: float
    completed_tokens: int  # completion tokens of the streams that ran to the end (their final usage)
    leaver_received: int  # tokens the leaving clients received before they left
    wall_s: float
    idle_gauges: dict[str, float]

    @property
    def unseen(self) -> float:
        """Tokens computed for leavers that no client received: discarded + after-cancel + in transit."""
        return self.total - self.completed_tokens - self.leaver_received

    @property
    def counted_ratio(self) -> float:
        return (self.discarded + self.after_cancel) / self.total

    @property
    def unseen_ratio(self) -> float:
        return self.unseen / self.total


async def _storm_callers(
    server: SluiceServer,
    shim: SluiceShim,
    *,
    streams: int,
    leave_fraction: float,
    max_tokens: int,
    leave_after: int,
) -> tuple[list[Caller], list[Caller]]:
    leavers = round(streams * leave_fraction)
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=0)
    async with (
        grpc.aio.insecure_channel(server.target) as channel,
        httpx.AsyncClient(base_url=shim.url, timeout=CALL_TIMEOUT_S, limits=limits) as http,
    ):
        stub = pb_grpc.InferenceServiceStub(channel)
        jobs = []
        for i in range(streams):
            leave = leave_after if i < leavers else None
            prompt = f"storm caller {i:03d}"
            if i % 2 == 0:  # half of each group by gRPC cancel, half by closing the SSE connection
                jobs.append(grpc_caller(stub, prompt, max_tokens=max_tokens, leave_after=leave))
            else:
                jobs.append(sse_caller(http, prompt, max_tokens=max_tokens, leave_after=leave))
        results = await asyncio.wait_for(asyncio.gather(*jobs), timeout=CALL_TIMEOUT_S)
    return list(results[:leavers]), list(results[leavers:])


def disconnect_storm(
    server: SluiceServer,
    shim: SluiceShim,
    *,
    streams: int = 50,
    leave_fraction: float = 0.4,
    max_tokens: int = 1000,
    leave_after: int = 50,
) -> StormResult:
    wait_idle(server)
    names = (
        "sluice_tokens_generated_total",
        "sluice_tokens_discarded_total",
        "sluice_tokens_after_cancel_total",
    )
    before = [counter(server, n) for n in names]
    started = time.perf_counter()
    leavers, stayers = asyncio.run(
        _storm_callers(
            server,
            shim,
            streams=streams,
            leave_fraction=leave_fraction,
            max_tokens=max_tokens,
            leave_after=leave_after,
        )
    )
    wall = time.perf_counter() - started
    gauges = wait_idle(server)
    total, discarded, after_cancel = (counter(server, n) - b for n, b in zip(names, before, strict=True))
    missing = [c for c in stayers if c.completion_tokens is None]
    if missing:
        raise RuntimeError(f"{len(missing)} full-length streams ended without a final message")
    return StormResult(
        streams=streams,
        leavers=len(leavers),
        total=total,
        discarded=discarded,
        after_cancel=after_cancel,
        completed_tokens=sum(c.completion_tokens or 0 for c in stayers),
        leaver_received=sum(c.received for c in leavers),
        wall_s=wall,
        idle_gauges=gauges,
    )
