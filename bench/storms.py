"""Issue 4 storms against the real server and shim on loopback: a disconnect storm (how many tokens are
computed for callers who already left) and slow clients (memory of both processes, the normal callers'
token rate, stalled consumers ended by the server). tests/integration/test_storms.py asserts a smaller run.

    .venv/bin/python -m bench.storms [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench import plot
from bench.disconnect_storm import StormResult, disconnect_storm
from bench.slow_clients import SlowResult, normal_rounds, slow_clients
from bench.stack import running
from bench.storm_server import storm_server_flags, wait_idle


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
    plot.draw(
        "storms_disconnect",
        [
            plot.Panel(
                "tokens computed for callers who had left",
                "% of all tokens",
                {
                    "counted (discarded + after cancel)": {
                        r0.leavers: [100 * r.counted_ratio for r in results]
                    },
                    "unseen by any client": {r0.leavers: [100 * r.unseen_ratio for r in results]},
                },
                log_x=False,
            ),
        ],
        x_label="callers that leave mid-stream",
        title="bench.storms: disconnect storm",
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
    plot.draw(
        "storms_slow",
        [
            plot.Panel(
                "normal callers' tokens/s",
                "tokens/s",
                {
                    "unloaded": {10: unloaded},
                    f"beside {slow} slow + {silent} silent readers": {
                        10: [statistics.median(r.normal_tokens_per_s) for r in loaded]
                    },
                },
                log_x=False,
            ),
            plot.Panel(
                "peak RSS growth",
                "MB",
                {name: {10: [r.rss_growth_mb[name] for r in loaded]} for name in ("server", "shim")},
                log_x=False,
            ),
        ],
        x_label="normal SSE callers",
        title="bench.storms: slow clients",
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
