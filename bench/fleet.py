"""Prefix routing against round-robin (issue 33, acceptance 1), all of it in one run: a fleet of byte-LM
replicas (`--access-log 1`, so each call's replica is known by its request id), shims in front of it
(`--routing round_robin` and `--routing prefix`), and multi-turn chat sessions that resend their
conversation each turn through the official `openai` SDK, streamed, opening over `--ramp-s` and reading
each answer for `--think-s` (bench/fleet_sessions.py). Per repeat, three phases, each with sessions of its
own words (one phase's cache never serves another's):

1. round-robin over the four replicas; 2. prefix routing over the same four;
3. prefix routing (a third shim) over replicas 1-3 and, in replica 0's place, a slow one: the same model
with a smaller KV budget (`--slow-kv-mib`), so it runs few sequences at once and keeps few prefixes; calls
routed there wait for KV. A smaller budget rather than a busy model: on a 2-core machine a busy model's
decoding takes the other replicas' CPU too, and so slows the whole fleet, not one replica.

Prints per phase TTFT p50 and p99, the fleet's cached-token share (usage cached_tokens / prompt tokens) and
each replica's share of the calls; then, as medians over repeats with their range, against the targets:
TTFT p50 round-robin / prefix >= 3x; prefix's cached share >= 0.8; the slow replica's share of calls under
prefix routing below replica 0's healthy share; the p99 TTFT of the calls it served at most the others'.

The system prompt is long (`--opening-words`, ~6.5 byte-LM tokens a word: its tokens are bytes) and
answers short (8 tokens), so TTFT is the prefill of the resent conversation, which a replica that holds it
skips. Also per phase: where the cached share went (first turns, each turn's new tail, turns moved off
their previous replica, turns that followed it and still missed), prefixes evicted, and the CPU the
fleet, shim and client used (cores, ms a call) beside the machine's busy cores.

The load is one a 2-core machine serves: 64 sessions, not 64 at once in a closed loop. Sessions open over
16 s, and users pause 3 to 9 s between turns (`--think-s 6`, uniform 0.5-1.5x, seeded: reading an answer
and typing the next message; real users take longer), so about 10 calls a second are offered: ~1.5
cores at round-robin's ~150 ms of CPU a call here. Before (2 s pauses, all 64 open within 8 s) the
offered load was twice what 2 cores serve, TTFT was seconds of waiting for CPU, and the ratio measured
each routing's CPU per call (~1.6x) rather than the prefill a cache hit skips. Eight turns, as vLLM's
synthetic multi-turn benchmark (benchmarks/multi_turn: 12-18 messages, 6-9 user turns).

    .venv/bin/python -m bench.fleet [--replicas 4] [--sessions 64] [--turns 8] [--repeats 3]
        [--think-s 6] [--ramp-s 16] [--opening-words 150] [--max-tokens 8] [--size small]
        [--slow-kv-mib 48 (holds 6,144 small / 2,048 bench tokens; at least --context-length)] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from bench.fleet_sessions import Turn, cached_share, run_sessions, served_by, share_loss
from bench.points import cpu_seconds, machine_busy_seconds
from bench.prometheus import parse, total
from bench.stack import STOP_GRACE_S, SluiceServer, SluiceShim
from bench.stats import Spread, percentile

__all__ = ["Turn", "cached_share", "run_sessions"]  # tests/integration/test_fleet_routing.py drives these

PHASES = ("round_robin", "prefix", "prefix_slow")
REASONS = ("prefix", "least_loaded", "balanced")  # shim/upstream/routing/prefix.py


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of one repeat: its calls and the replica that served each."""

    turns: list[Turn]
    replica: list[int]
    reasons: dict[str, float]  # why prefix routing sent the calls where it did (sluice_shim_routed_total)
    cpu_s: float  # the replicas', the shim's and this client's CPU seconds in the phase
    busy_s: float  # the whole machine's (others' work too, where others share it)
    wall_s: float
    evictions: float  # cached prefixes the phase's replicas evicted for memory

    def ttft_ms(self, keep: Any = None) -> list[float]:
        return [
            t.ttft_s * 1000 for t, r in zip(self.turns, self.replica, strict=True) if keep is None or keep(r)
        ]

    def share(self, replica: int) -> float:
        return self.replica.count(replica) / max(1, len(self.replica))


def _cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line), "?")


def _cores() -> int:
    return len(psutil.Process().cpu_affinity() or []) or (os.cpu_count() or 1)


def _met(value: str, target: str, ok: bool) -> str:
    return f"{value} (target {target}: {'met' if ok else 'MISSED'})"


def report(args: argparse.Namespace, phases: dict[str, list[Phase]], wall_s: float) -> None:
    print(
        f"bench.fleet: {args.replicas} replicas of byte-lm ({args.size}, context {args.context_length}, "
        f"--max-sequences {args.max_sequences}, KV {args.kv_mib} MiB each), {args.sessions} sessions x "
        f"{args.turns} turns (opening over {args.ramp_s:g} s), system prompt {args.opening_words} words, "
        f"answers {args.max_tokens} tokens; "
        f"{args.repeats} repeats, {wall_s:.0f} s; CPU: {_cpu()}"
    )
    print(f"  slow replica (phase prefix_slow): replica 0's place taken by one with a KV budget of "
          f"{args.slow_kv_mib} MiB; users think {args.think_s:g} s between turns")  # fmt: skip
    p50: dict[str, list[float]] = {}
    for name, runs in phases.items():
        p50[name] = [percentile(run.ttft_ms(), 50) for run in runs]
        p99 = [percentile(run.ttft_ms(), 99) for run in runs]
        shares = [cached_share(run.turns) for run in runs]
        calls = ["/".join(f"{run.share(r):.2f}" for r in range(args.replicas)) for run in runs]
        why = ", ".join(f"{w} {Spread.of([run.reasons[w] for run in runs]).format(0)}" for w in REASONS)
        print(
            f"  {name:12} TTFT p50 {Spread.of(p50[name]).format(1)} ms, p99 {Spread.of(p99).format(1)} ms, "
            f"cached share {Spread.of(shares).format(3)}, calls per replica {' '.join(calls)}"
            + (f"; routed: {why}" if name != "round_robin" else "")
        )
        cores = Spread.of([run.cpu_s / run.wall_s for run in runs]).format(2)
        machine = Spread.of([run.busy_s / run.wall_s for run in runs]).format(2)
        per_call = Spread.of([1000 * run.cpu_s / len(run.turns) for run in runs]).format(0)
        evictions = Spread.of([run.evictions for run in runs]).format(0)
        print(f"  {'':12} CPU: fleet+shim+client {cores} cores ({per_call} ms a call), machine {machine} "
              f"of {_cores()} cores; prefixes evicted {evictions}; share, repeat 1: "
              f"{share_loss(runs[0].turns, runs[0].replica).format()}")  # fmt: skip
    ratio = Spread.of([rr / px for rr, px in zip(p50["round_robin"], p50["prefix"], strict=True)])
    share = Spread.of([cached_share(run.turns) for run in phases["prefix"]])
    print("  targets (median [range] over repeats):")
    print(f"    TTFT p50 round_robin / prefix: {_met(ratio.format(2) + 'x', '>= 3x', ratio.median >= 3)}")
    print(f"    cached share, prefix: {_met(share.format(3), '>= 0.8', share.median >= 0.8)}")
    if "prefix_slow" not in phases:
        return
    healthy = Spread.of([run.share(0) for run in phases["prefix"]])
    slowed = Spread.of([run.share(0) for run in phases["prefix_slow"]])
    print(f"    replica 0's share of calls, prefix: healthy {healthy.format(3)}, slow "
          f"{_met(slowed.format(3), 'below healthy', slowed.median < healthy.median)}")  # fmt: skip
    slow_p99 = [percentile(run.ttft_ms(lambda r: r == 0), 99) for run in phases["prefix_slow"]]
    others_p99 = [percentile(run.ttft_ms(lambda r: r != 0), 99) for run in phases["prefix_slow"]]
    slow_max = [max(run.ttft_ms(lambda r: r == 0), default=math.nan) for run in phases["prefix_slow"]]
    served = [phases["prefix_slow"][i].replica.count(0) for i in range(len(slow_p99))]
    # A replica that served no call kept no one waiting: its p99 counts as 0 against the others'.
    held = [(0.0 if math.isnan(s) else s) <= o for s, o in zip(slow_p99, others_p99, strict=True)]
    print(f"    slow phase TTFT p99: calls replica 0 served {Spread.of(slow_p99).format(1)} ms (max "
          f"{Spread.of(slow_max).format(1)} ms; calls {'/'.join(map(str, served))}), the others' "
          f"{Spread.of(others_p99).format(1)} ms: {_met(f'{sum(held)}/{len(held)} repeats', 'at most the others', all(held))}")  # fmt: skip  # noqa: E501


def _evictions(servers: Sequence[SluiceServer]) -> float:
    return sum(s.metric("sluice_prefix_cache_evictions_total") for s in servers)


def _reasons(url: str) -> dict[str, float]:
    samples = parse(httpx.get(f"{url}/metrics", timeout=30).text)
    return {why: total(samples, "sluice_shim_routed_total", reason=why) for why in REASONS}


def _phase(
    args: argparse.Namespace,
    shim: SluiceShim,
    servers: Sequence[SluiceServer],
    *,
    seed: int,
    name: str,
) -> Phase:
    url = shim.url
    pids = [shim.pid, os.getpid(), *(s.pid for s in servers)]
    before = _reasons(url)
    evicted = _evictions(servers)
    cpu, busy, began = cpu_seconds(pids), machine_busy_seconds(), time.monotonic()
    turns = asyncio.run(
        run_sessions(
            url, sessions=args.sessions, turns=args.turns, seed=seed, opening_words=args.opening_words,
            tag=name, start_gap_s=args.ramp_s / args.sessions, think_s=args.think_s,
            max_tokens=args.max_tokens,
        )
    )  # fmt: skip
    cpu, busy, wall = cpu_seconds(pids) - cpu, machine_busy_seconds() - busy, time.monotonic() - began
    # A replica writes a call's access-log line as the call ends: the last few may still be on their way.
    deadline = time.monotonic() + 30
    while True:
        try:
            served = served_by([list(s.lines) for s in servers], turns)
            after = _reasons(url)
            reasons = {why: after[why] - before[why] for why in REASONS}
            return Phase(turns, served, reasons, cpu, busy, wall, _evictions(servers) - evicted)
        except LookupError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="small", help="byte-lm size (tiny, small, bench)")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--opening-words", type=int, default=150, help="each session's system prompt")
    parser.add_argument("--max-sequences", type=int, default=24, help="per replica")
    parser.add_argument("--kv-mib", type=int, default=1024, help="each replica's KV cache")
    parser.add_argument("--slow-kv-mib", type=int, default=48, help="the slow replica's KV cache")
    parser.add_argument("--max-tokens", type=int, default=8, help="each answer's length")
    parser.add_argument("--think-s", type=float, default=6.0, help="a user's pause between turns (mean)")
    parser.add_argument("--ramp-s", type=float, default=16.0, help="sessions open evenly over this long")
    parser.add_argument("--no-slow", action="store_true", help="skip the slowed-replica phase")
    parser.add_argument("--quick", action="store_true", help="4 replicas, 8 sessions, 6 turns, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.turns, args.repeats, args.opening_words = 8, 6, 1, 120
        args.ramp_s, args.think_s = 2.0, 0.5
    flags = ("--models", "byte-lm", "--model-options", f"byte-lm.size={args.size}",
             "--context-length", str(args.context_length), "--max-sequences", str(args.max_sequences),
             "--torch-threads", "1", "--probe-interval-s", "0.2", "--access-log", "1")  # fmt: skip
    names = PHASES[:2] if args.no_slow else PHASES
    phases: dict[str, list[Phase]] = {name: [] for name in names}
    started = time.monotonic()
    with ExitStack() as stack:

        def server(kv_mib: int) -> SluiceServer:
            child = SluiceServer(*flags, "--kv-cache-bytes", str(kv_mib << 20))
            stack.callback(child.stop, STOP_GRACE_S)
            return child

        def shim(fleet: Sequence[SluiceServer], mode: str) -> SluiceShim:
            child = SluiceShim(
                ",".join(s.target for s in fleet), "--routing", mode, "--routing-probe-s", "0.2"
            )
            stack.callback(child.stop, STOP_GRACE_S)
            return child

        healthy = [server(args.kv_mib) for _ in range(args.replicas)]
        fleets = {"round_robin": healthy, "prefix": healthy}
        if not args.no_slow:
            fleets["prefix_slow"] = [server(args.slow_kv_mib), *healthy[1:]]
        shims = {name: shim(fleet, name.removesuffix("_slow")) for name, fleet in fleets.items()}
        for repeat in range(args.repeats):
            for number, name in enumerate(names):
                began = time.monotonic()
                seed = repeat * len(PHASES) + number
                phases[name].append(_phase(args, shims[name], fleets[name], seed=seed, name=name))
                print(f"  repeat {repeat + 1}/{args.repeats} {name}: {time.monotonic() - began:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    report(args, phases, time.monotonic() - started)


if __name__ == "__main__":
    main()
