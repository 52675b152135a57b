"""Experiment B, slow clients: hundreds of trickling or silent SSE readers and gRPC callers that stop
reading, against a few full-speed callers; the normal callers' token rate, the memory of server and shim,
and whether the server ends the stalled streams and frees their KV slots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import httpx

from bench.rss import RssSampler
from bench.stack import SluiceServer, SluiceShim
from bench.storm_clients import (
    CALL_TIMEOUT_S,
    STALLED_CHANNEL_OPTIONS,
    sse_caller,
    stalled_grpc_caller,
    trickle_reader,
)
from bench.storm_server import MODEL, counter, wait_idle, wait_until


@dataclass(frozen=True)
class SlowResult:
    normal_tokens_per_s: list[float]  # one per round of the normal callers
    rss_growth_mb: dict[str, float]
    slow_bytes_read: int
    stalled_ended: float  # rise of sluice_streams_stalled_total
    stalled_reasons: list[str]  # what each stalled caller found when it finally read
    kv_slots_after_stall: float  # while the stalled callers' calls were still open
    held_after_done: float  # Generate calls still admitted, their sequences done, for slow/silent SSE clients
    idle_gauges: dict[str, float]


async def normal_rounds(shim: SluiceShim, *, callers: int, max_tokens: int, rounds: int) -> list[float]:
    """Aggregate tokens/s of `callers` full-speed SSE streams, once per round."""
    rates = []
    async with httpx.AsyncClient(base_url=shim.url, timeout=CALL_TIMEOUT_S) as http:
        for r in range(rounds):
            started = time.perf_counter()
            seen = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        sse_caller(http, f"normal {r} {i}", max_tokens=max_tokens, leave_after=None)
                        for i in range(callers)
                    )
                ),
                timeout=CALL_TIMEOUT_S,
            )
            rates.append(sum(c.received for c in seen) / (time.perf_counter() - started))
    return rates


async def _poll(predicate: Callable[[], bool], limit_s: float, what: str) -> None:
    await asyncio.to_thread(wait_until, predicate, limit_s, what)


async def _slow_storm(
    server: SluiceServer,
    shim: SluiceShim,
    *,
    slow: int,
    silent: int,
    stalled: int,
    normal: int,
    normal_tokens: int,
    rounds: int,
    slow_tokens: int,
    stall_timeout_s: float,
) -> tuple[list[float], int, list[str], float, float]:
    stalled_before = counter(server, "sluice_streams_stalled_total")
    admitted_before = server.metric("sluice_requests_admitted_total", method="Generate")
    hold_s = stall_timeout_s + 60.0  # the trickle readers outlive the measurement; cancelled at the end
    ended = asyncio.Event()
    slow_read: list[int] = []
    async with grpc.aio.insecure_channel(server.target, options=STALLED_CHANNEL_OPTIONS) as channel:
        stall_jobs = [
            asyncio.create_task(stalled_grpc_caller(channel, f"stall {i}", ended)) for i in range(stalled)
        ]
        readers = [
            asyncio.create_task(
                trickle_reader(
                    shim.port,
                    f"slow {i}",
                    max_tokens=slow_tokens,
                    bytes_per_s=100,
                    duration_s=hold_s,
                    read=slow_read,
                )
            )
            for i in range(slow)
        ]
        readers += [
            asyncio.create_task(
                trickle_reader(
                    shim.port,
                    f"silent {i}",
                    max_tokens=slow_tokens,
                    bytes_per_s=0,
                    duration_s=hold_s,
                    read=[],
                )
            )
            for i in range(silent)
        ]
        try:
            # The slow callers' tokens are computed up front (their whole output fits the transport's
            # buffers); what remains is the load of many open, trickling connections on shim and server.
            await _poll(
                lambda: (
                    server.metric("sluice_requests_admitted_total", method="Generate") - admitted_before
                    >= slow + silent + stalled
                    and server.metric("sluice_sequences_active", model=MODEL) <= stalled
                ),
                60.0,
                "the slow callers' sequences to be computed",
            )
            rates = await normal_rounds(shim, callers=normal, max_tokens=normal_tokens, rounds=rounds)
            held = await asyncio.to_thread(server.metric, "sluice_requests_in_flight", method="Generate")
            await _poll(
                lambda: counter(server, "sluice_streams_stalled_total") - stalled_before >= stalled,
                stall_timeout_s + 30.0,
                "the stalled callers to be ended",
            )
            kv_after_stall = await asyncio.to_thread(counter, server, "sluice_kv_slots_in_use")
            ended.set()
            reasons = await asyncio.wait_for(asyncio.gather(*stall_jobs), timeout=30.0)
        finally:
            for task in [*readers, *stall_jobs]:
                task.cancel()
            await asyncio.gather(*readers, *stall_jobs, return_exceptions=True)
    return rates, sum(slow_read), list(reasons), kv_after_stall, held - stalled


def slow_clients(
    server: SluiceServer,
    shim: SluiceShim,
    *,
    slow: int = 200,
    silent: int = 10,
    stalled: int = 10,
    normal: int = 10,
    normal_tokens: int = 200,
    rounds: int = 3,
    slow_tokens: int = 200,
    stall_timeout_s: float,
) -> SlowResult:
    wait_idle(server)
    stalled_before = counter(server, "sluice_streams_stalled_total")
    with RssSampler({"server": server.pid, "shim": shim.pid}) as rss:
        rates, slow_read, reasons, kv_after_stall, held = asyncio.run(
            _slow_storm(
                server,
                shim,
                slow=slow,
                silent=silent,
                stalled=stalled,
                normal=normal,
                normal_tokens=normal_tokens,
                rounds=rounds,
                slow_tokens=slow_tokens,
                stall_timeout_s=stall_timeout_s,
            )
        )
        gauges = wait_idle(server)
    return SlowResult(
        normal_tokens_per_s=rates,
        rss_growth_mb=rss.growth_mb(),
        slow_bytes_read=slow_read,
        stalled_ended=counter(server, "sluice_streams_stalled_total") - stalled_before,
        stalled_reasons=reasons,
        kv_slots_after_stall=kv_after_stall,
        held_after_done=held,
        idle_gauges=gauges,
    )
