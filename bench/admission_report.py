"""What bench.admission prints after its runs: the setting, the table, ratios against the raw loop, the naive
service and the gRPC baselines, server CPU per call outside the forward pass, the targets, the refusal probe.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from bench import report
from bench.points import PointResult
from bench.refusal_probe import ProbeResult
from bench.stats import Spread

Side = Mapping[int, Sequence[PointResult]]  # callers -> one result per repeat


@dataclass(frozen=True, slots=True)
class RawLoop:
    """The raw model loop's repeats: items/s, the cores it kept busy itself, and the machine's other load."""

    batch: int
    items_per_s: Sequence[float]
    cores: Sequence[float]
    other_cores: Sequence[float]

    def forward_cpu_s(self) -> list[float]:
        """CPU seconds of the forward pass per item, per repeat (1 / items/s with one torch thread)."""
        return [c / r if r > 0 else math.nan for c, r in zip(self.cores, self.items_per_s, strict=True)]


@dataclass(frozen=True, slots=True)
class Generator:
    """One load generator's sides, by their keys in the results."""

    name: str
    sluice: str  # the embedded MLP, traced
    naive: str
    plain: str
    noop: str
    eager: str  # the same MLP as a user's eager plugin (bench/eager_mlp.py)


GENERATORS = (
    Generator("Python clients", "sluice", "naive", "plain", "noop", "sluice-eager"),
    Generator(
        "h2load", "sluice-h2load", "naive-h2load", "plain-h2load", "noop-h2load", "sluice-eager-h2load"
    ),
)


def ok(side: Side, callers: int) -> list[float]:
    return [p.ok_per_s for p in side.get(callers, [])]


def cpu_per_call_s(side: Side, callers: int, subtract: Sequence[float] | None) -> list[float]:
    """Service CPU seconds per OK call in the window, per repeat, less `subtract` (per repeat) if given."""
    points = side.get(callers, [])
    less = subtract if subtract is not None else [0.0] * len(points)
    return [
        p.service_cores / p.ok_per_s - s if p.ok_per_s > 0 else math.nan
        for p, s in zip(points, less, strict=False)
    ]


def micros(values: Sequence[float]) -> str:
    return Spread.of([v * 1e6 for v in values]).format(0)


def print_setting(
    args: argparse.Namespace, load_before: tuple[float, float, float], elapsed_s: float
) -> None:
    load_after = os.getloadavg()
    print()
    print(
        f"machine: {platform.machine()} {os.cpu_count()} logical cores; torch {torch.__version__}, "
        f"torch threads {args.torch_threads} on every side (in-process, --torch-threads)"
    )
    print(
        f"window {args.duration_s:g} s after {args.warmup_s:g} s warm-up per point; {args.repeats} repeats, "
        f"interleaved; {args.client_procs} load-generator process(es) per point; "
        f"deadline {args.timeout_s:g} s; run took {elapsed_s:.0f} s"
    )
    print(
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (shared machine); each point "
        f"waited up to {args.quiet_wait_s:g} s for other load < {args.quiet_cores:g} cores ('other cores')"
    )
    print("the load generator shares the cores with the service: 'client cores' is its CPU use,")
    print("'svc cores' the service's; cells are median [min-max] over repeats; latencies are of calls")
    print("finished in the window")


def print_report(
    args: argparse.Namespace,
    results: Mapping[str, Side],
    labels: Mapping[str, str],
    raw: RawLoop,
    notes: Mapping[str, str],
    load_before: tuple[float, float, float],
    elapsed_s: float,
) -> None:
    print_setting(args, load_before, elapsed_s)
    for key, capacity in notes.items():
        print(f"{labels[key]} capacity plan: {capacity}")
    print()
    print(report.table(results, labels, raw.items_per_s, raw.other_cores, raw.batch))
    report.draw(
        "admission",
        "bench.admission: Infer through Sluice and the baselines",
        results,
        labels,
        raw.items_per_s,
    )
    print()
    print("errors other than refusals:")
    print(report.errors_note(results, labels))
    print()
    measured = [g for g in GENERATORS if g.sluice in results or g.eager in results]
    empty: Side = {}

    def side(key: str) -> Side:
        return results.get(key, empty)

    print("ratios (per repeat, median [min-max]), each load generator against the same raw-loop repeats:")
    for g in measured:
        sluice = side(g.sluice)
        for callers in sorted(sluice):
            pairs = report.paired(ok(sluice, callers), raw.items_per_s)
            print(report.ratio_line(f"[{g.name}] sluice @ {callers} / raw batch-{raw.batch} items/s", pairs))
        for other, label in ((g.naive, "naive"), (g.plain, "plain batcher"), (g.noop, "no-op")):
            for callers in sorted(set(sluice) & set(side(other))):
                pairs = report.paired(ok(sluice, callers), ok(side(other), callers))
                print(report.ratio_line(f"[{g.name}] sluice @ {callers} / {label} @ {callers} ok/s", pairs))
        for callers in sorted(set(side(g.eager)) & set(side(g.plain))):
            pairs = report.paired(ok(side(g.eager), callers), ok(side(g.plain), callers))
            print(report.ratio_line(f"[{g.name}] sluice eager plugin @ {callers} / plain @ {callers}", pairs))
    print()
    forward = raw.forward_cpu_s()
    print("server CPU per call outside the forward pass, µs (svc cores / ok/s), where batches fill (>= 64):")
    print(
        f"  less the raw loop's forward CPU per item at batch {raw.batch} ({micros(forward)} µs) for sluice "
        "and the plain batcher; nothing for the no-op"
    )
    for g in measured:
        for callers in sorted(c for c in {*side(g.sluice), *side(g.eager)} if c >= 64):
            cells = [
                f"sluice {micros(cpu_per_call_s(side(g.sluice), callers, forward))}",
                f"sluice eager plugin {micros(cpu_per_call_s(side(g.eager), callers, forward))}",
                f"plain batcher {micros(cpu_per_call_s(side(g.plain), callers, forward))}",
                f"no-op {micros(cpu_per_call_s(side(g.noop), callers, None))}",
            ]
            print(f"  [{g.name}] @ {callers}: " + ", ".join(cells))
    print()
    print("targets:")
    for g in measured:
        sluice, naive, plain = side(g.sluice), side(g.naive), side(g.plain)
        overhead = report.paired(cpu_per_call_s(sluice, 64, forward), cpu_per_call_s(side(g.noop), 64, None))
        for target in [
            report.Target(
                f"[{g.name}] sluice @ 64 / raw batch-{raw.batch} (items/s)",
                report.paired(ok(sluice, 64), raw.items_per_s),
                0.75,
            ),
            report.Target(
                f"[{g.name}] sluice @ 16 / naive @ 16 (throughput)",
                report.paired(ok(sluice, 16), ok(naive, 16)),
                2.5,
            ),
            report.Target(
                f"[{g.name}] sluice @ 64 / plain batcher @ 64 (throughput)",
                report.paired(ok(sluice, 64), ok(plain, 64)),
                1.3,
            ),
            report.Target(
                f"[{g.name}] sluice eager plugin @ 64 / plain batcher @ 64 (throughput, same eager module)",
                report.paired(ok(side(g.eager), 64), ok(plain, 64)),
                1.2,
            ),
            report.Target(
                f"[{g.name}] sluice goodput @ 256 / @ 64", report.paired(ok(sluice, 256), ok(sluice, 64)), 0.9
            ),
            report.Target(
                f"[{g.name}] sluice CPU per call outside forward / no-op CPU per call (@ 64)",
                overhead,
                1.3,
                ceiling=True,
            ),
        ]:
            print(report.target_line(target))
    for callers, points in sorted(side("defaults").items()):
        print(
            f"  sluice with default settings @ {callers}: goodput "
            f"{Spread.of([p.ok_per_s for p in points]).format(0)} ok/s, refused "
            f"{Spread.of([float(p.refused) for p in points]).format(0)} calls per "
            f"{args.duration_s:g} s window"
        )


def print_probes(probes: Sequence[ProbeResult], *, slots: int, queue: int) -> None:
    if not probes:
        return
    print()
    print(
        f"refusal probe: sluice gRPC (N={slots}, Q={queue}) held full by {slots + queue} "
        "callers, one more caller in its own process:"
    )
    print(
        f"  QUEUE_FULL answered in p50 {Spread.of([p.refused_p50_ms for p in probes]).format(2)} ms, "
        f"p99 {Spread.of([p.refused_p99_ms for p in probes]).format(2)} ms "
        f"({Spread.of([float(p.refused) for p in probes]).format(0)} refusals per window, "
        f"{Spread.of([float(p.admitted) for p in probes]).format(0)} probe calls found a free place); "
        f"the holders got {Spread.of([p.load_ok_per_s for p in probes]).format(0)} ok/s"
    )
