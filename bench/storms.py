"""Issue 4 storms against the real server and shim on loopback: a disconnect storm (how many tokens are
computed for callers who already left) and slow clients (memory of both processes, the normal callers'
token rate, stalled consumers ended by the server). tests/integration/test_storms.py asserts a smaller run.

    .venv/bin/python -m bench.storms [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import httpx
import psutil
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.processes import ServerProcess, ShimProcess, start_server, start_shim, wait_until

MODEL = "byte-lm"
CALL_TIMEOUT_S = 120.0
# A caller that stops reading entirely: a small receive window so that its few buffered messages fill it.
STALLED_CHANNEL_OPTIONS = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def storm_server_flags(*, max_sequences: int, context_length: int, stall_timeout_s: float) -> list[str]:
    return [
        "--models",
        MODEL,
        "--max-sequences",
        str(max_sequences),
        "--max-queue",
        str(max_sequences),
        "--context-length",
        str(context_length),
        "--stall-timeout-s",
        str(stall_timeout_s),
        # One intra-op thread: on a 2-core machine shared with the clients, torch's spinning OpenMP
        # threads slow every step many times over (30 x 200 tokens: ~5 s with the default, <1 s with 1).
        "--torch-threads",
        "1",
    ]


@contextmanager
def running(*flags: str) -> Iterator[tuple[ServerProcess, ShimProcess]]:
    """The real server and shim, both reaped however the block ends."""
    server = start_server(*flags)
    try:
        shim = start_shim(server.target)
        try:
            yield server, shim
        finally:
            shim.terminate()
    finally:
        server.terminate()


def counter(server: ServerProcess, name: str) -> float:
    return server.metric(name, model=MODEL)


def wait_idle(server: ServerProcess, timeout: float = 60.0) -> dict[str, float]:
    """Waits until no sequence, KV slot or Generate call is held; returns those gauges."""
    gauges = {
        "sluice_kv_slots_in_use": {"model": MODEL},
        "sluice_sequences_active": {"model": MODEL},
        "sluice_requests_in_flight": {"method": "Generate"},
    }
    values: dict[str, float] = {}

    def idle() -> bool:
        values.update({name: server.metric(name, **labels) for name, labels in gauges.items()})
        return not any(values.values())

    wait_until(idle, timeout=timeout, what=f"an idle server (last seen {values})")
    return values


# -- callers ------------------------------------------------------------------------------------------
@dataclass
class Caller:
    """What one stream's client saw: tokens received, and the server's count if it reached the end."""

    received: int = 0
    completion_tokens: int | None = None
    first_token_s: float | None = None
    finished_s: float | None = None


async def grpc_caller(
    stub: pb_grpc.InferenceServiceStub, prompt: str, *, max_tokens: int, leave_after: int | None
) -> Caller:
    """Reads a Generate stream; with leave_after, cancels the call once that many tokens arrived."""
    seen = Caller()
    request = pb.GenerateRequest(
        model=MODEL, text=prompt, sampling=pb.SamplingParams(max_tokens=max_tokens, seed=len(prompt))
    )
    call = stub.Generate(request, timeout=CALL_TIMEOUT_S)
    try:
        async for message in call:
            seen.received += len(message.token_ids)
            if message.finish_reason:
                seen.completion_tokens = message.usage.completion_tokens
            elif leave_after is not None and seen.received >= leave_after:
                break
    finally:
        call.cancel()
    return seen


async def sse_caller(
    http: httpx.AsyncClient, prompt: str, *, max_tokens: int, leave_after: int | None
) -> Caller:
    """Reads /v1/generate as SSE; with leave_after, closes the connection once that many tokens arrived."""
    seen = Caller()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "seed": len(prompt), "stream": True}
    started = time.perf_counter()
    async with http.stream("POST", "/v1/generate", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = json.loads(line[5:])
            if "usage" in data:
                seen.completion_tokens = data["usage"]["completion_tokens"]
                seen.finished_s = time.perf_counter() - started
                break
            seen.received += len(data.get("token_ids", ()))
            if seen.first_token_s is None:
                seen.first_token_s = time.perf_counter() - started
            if leave_after is not None and seen.received >= leave_after:
                break  # leaving the block closes the connection mid-stream
    return seen


def sse_request(port: int, prompt: str, max_tokens: int) -> bytes:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    head = (
        f"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def trickle_reader(
    port: int,
    prompt: str,
    *,
    max_tokens: int,
    bytes_per_s: float,
    duration_s: float,
    read: list[int],
    rcvbuf: int = 2048,
) -> None:
    """A raw-socket SSE client with a small receive buffer that reads ~bytes_per_s (0: never reads)
    for duration_s or until cancelled, then closes; appends the size of each read to `read`."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, sse_request(port, prompt, max_tokens))
        end = time.monotonic() + duration_s
        while (left := end - time.monotonic()) > 0:
            if bytes_per_s <= 0:
                await asyncio.sleep(left)
                break
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 100), timeout=left)
            except TimeoutError:
                break
            if not data:
                break
            read.append(len(data))
            await asyncio.sleep(len(data) / bytes_per_s)
    finally:
        sock.close()


# -- A: disconnect storm ----------------------------------------------------------------------------
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
    server: ServerProcess,
    shim: ShimProcess,
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
    server: ServerProcess,
    shim: ShimProcess,
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


# -- B: slow clients ----------------------------------------------------------------------------------
class RssSampler:
    """Samples the resident set of some processes on a thread; peak growth over the starting value."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.05) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.start = {name: p.memory_info().rss for name, p in self.procs.items()}
        self.peak = dict(self.start)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, proc in self.procs.items():
                self.peak[name] = max(self.peak[name], proc.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def growth_mb(self) -> dict[str, float]:
        return {name: (self.peak[name] - self.start[name]) / 1e6 for name in self.procs}


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


async def normal_rounds(shim: ShimProcess, *, callers: int, max_tokens: int, rounds: int) -> list[float]:
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


async def stalled_grpc_caller(channel: grpc.aio.Channel, prompt: str, ended: asyncio.Event) -> str:
    """Reads one message, then nothing until `ended`; then drains and returns the final error reason."""
    stub = pb_grpc.InferenceServiceStub(channel)
    request = pb.GenerateRequest(model=MODEL, text=prompt, sampling=pb.SamplingParams(max_tokens=200))
    call = stub.Generate(request, timeout=CALL_TIMEOUT_S)
    try:
        await call.read()
        await ended.wait()
        while isinstance(message := await call.read(), pb.GenerateResponse):
            if message.finish_reason:
                return message.error.reason or pb.FinishReason.Name(message.finish_reason)
        return "no final message"
    finally:
        call.cancel()


async def _poll(predicate: Callable[[], bool], limit_s: float, what: str) -> None:
    await asyncio.to_thread(wait_until, predicate, limit_s, what)


async def _slow_storm(
    server: ServerProcess,
    shim: ShimProcess,
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
    server: ServerProcess,
    shim: ShimProcess,
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
    with RssSampler({"server": server.proc.pid, "shim": shim.proc.pid}) as rss:
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


# -- the printed run ----------------------------------------------------------------------------------
def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}-{max(values):.3g}]"


def print_storms(results: list[StormResult]) -> None:
    r0 = results[0]
    print(
        f"\nA. Disconnect storm: {r0.streams} streams, {r0.leavers} leave after 50 tokens (half gRPC cancel,"
    )
    print("   half SSE close); sluice_tokens_*_total; unseen = total - completed - leavers' received")
    print(
        f"{'repeat':>6} {'total':>8} {'discarded':>9} {'after_cxl':>9} {'unseen':>7} {'counted %':>9} "
        f"{'unseen %':>8} {'wall s':>6}"
    )
    for i, r in enumerate(results):
        print(
            f"{i:>6} {r.total:>8.0f} {r.discarded:>9.0f} {r.after_cancel:>9.0f} {r.unseen:>7.0f} "
            f"{100 * r.counted_ratio:>9.3f} {100 * r.unseen_ratio:>8.3f} {r.wall_s:>6.1f}"
        )
    worst = max(r.unseen_ratio for r in results)
    print(
        f"   target unseen < 1%: worst {100 * worst:.3f}% -> {'met' if worst < 0.01 else 'MISSED'}; "
        f"after the storm: {results[-1].idle_gauges}"
    )


def print_slow(
    unloaded: list[float], loaded: list[SlowResult], *, slow: int, silent: int, stalled: int
) -> None:
    print(f"\nB. Slow clients: {slow} SSE readers at ~100 B/s (SO_RCVBUF 2 KiB), {silent} SSE clients")
    print(
        f"   that never read, {stalled} gRPC callers that stop reading (1 KiB window), 10 normal SSE callers"
    )
    ratios = []
    for i, (base, run) in enumerate(zip(unloaded, loaded, strict=True)):
        ratio = statistics.median(run.normal_tokens_per_s) / base
        ratios.append(ratio)
        print(
            f"   repeat {i}: normal tok/s unloaded {base:.0f}, loaded {spread(run.normal_tokens_per_s)} "
            f"-> ratio {ratio:.2f}; peak RSS growth server {run.rss_growth_mb['server']:.1f} MB, "
            f"shim {run.rss_growth_mb['shim']:.1f} MB"
        )
        print(
            f"    stalled ended {run.stalled_ended:.0f}/{stalled} ({','.join(set(run.stalled_reasons))}),"
            f" KV slots in use after the stall {run.kv_slots_after_stall:.0f}, Generate calls held with"
            f" their sequence done {run.held_after_done:.0f}, slow readers read {run.slow_bytes_read} B"
        )
    growth = {k: max(r.rss_growth_mb[k] for r in loaded) for k in ("server", "shim")}
    print(
        f"   loaded/unloaded normal rate: {spread(ratios)} (target >= 0.8: "
        f"{'met' if statistics.median(ratios) >= 0.8 else 'MISSED'})"
    )
    print(
        f"   worst peak RSS growth: server {growth['server']:.1f} MB, shim {growth['shim']:.1f} MB "
        f"(target < 50 MB: {'met' if max(growth.values()) < 50 else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, smaller slow-client storm")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    slow, silent, stalled = (50, 5, 5) if args.quick else (200, 10, 10)

    flags = storm_server_flags(max_sequences=64, context_length=1100, stall_timeout_s=10)
    with running(*flags) as (server, shim):
        print_storms([disconnect_storm(server, shim) for _ in range(repeats)])

    stall_s = 5.0
    flags = storm_server_flags(max_sequences=256, context_length=256, stall_timeout_s=stall_s)
    unloaded, loaded = [], []
    with running(*flags) as (server, shim):
        asyncio.run(normal_rounds(shim, callers=10, max_tokens=200, rounds=1))  # warm both paths
        for _ in range(repeats):
            wait_idle(server)
            unloaded.append(
                statistics.median(asyncio.run(normal_rounds(shim, callers=10, max_tokens=200, rounds=3)))
            )
            loaded.append(
                slow_clients(server, shim, slow=slow, silent=silent, stalled=stalled, stall_timeout_s=stall_s)
            )
    print_slow(unloaded, loaded, slow=slow, silent=silent, stalled=stalled)


if __name__ == "__main__":
    main()
