"""The printed result: one row per side and caller count (median [min-max] of the repeats), then ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench import plot
from bench.points import PointResult
from bench.stats import Spread

Results = Mapping[str, Mapping[int, Sequence[PointResult]]]  # side -> callers -> one result per repeat

_COLUMNS: list[tuple[str, int, Callable[[PointResult], float]]] = [
    ("ok/s", 0, lambda p: p.ok_per_s),
    ("refused/s", 0, lambda p: p.refused_per_s),
    ("ok p50 ms", 1, lambda p: p.ok_p50_ms),
    ("ok p99 ms", 1, lambda p: p.ok_p99_ms),
    ("refused p50 ms", 1, lambda p: p.refused_p50_ms),
    ("refused p99 ms", 1, lambda p: p.refused_p99_ms),
    ("batch", 1, lambda p: p.mean_batch),
    ("compute ms", 1, lambda p: p.compute_ms),
    ("batch wait ms", 1, lambda p: p.batch_wait_ms),
    ("svc cores", 2, lambda p: p.service_cores),
    ("client cores", 2, lambda p: p.client_cores),
    ("other cores", 2, lambda p: p.other_cores),
]


@dataclass(frozen=True, slots=True)
class Target:
    """A ratio and the bar it must clear: `ratios` are per repeat (paired by repeat); the median must be at
    least `bar`, or at most `bar` for a ceiling (a cost)."""

    name: str
    ratios: Sequence[float]
    bar: float
    ceiling: bool = False


def table(
    results: Results,
    labels: Mapping[str, str],
    raw: Sequence[float],
    raw_other: Sequence[float],
    raw_batch: int,
) -> str:
    header = ["side", "callers", *(name for name, _, _ in _COLUMNS)]
    dashes = ["-"] * (len(_COLUMNS) - 2)
    raw_cells = [Spread.of(raw).format(0), *dashes, Spread.of(raw_other).format(2)]
    rows = [[f"raw model loop, batch {raw_batch}", "-", *raw_cells]]
    for side, by_callers in results.items():
        for callers, points in sorted(by_callers.items()):
            cells = [Spread.of([get(p) for p in points]).format(digits) for _, digits, get in _COLUMNS]
            rows.append([labels[side], str(callers), *cells])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def errors_note(results: Results, labels: Mapping[str, str]) -> str:
    lines = []
    for side, by_callers in results.items():
        for callers, points in sorted(by_callers.items()):
            errors: dict[str, int] = {}
            for p in points:
                for name, count in p.errors.items():
                    errors[name] = errors.get(name, 0) + count
            unfinished = sum(p.unfinished for p in points)
            if errors or unfinished:
                lines.append(
                    f"  {labels[side]} @ {callers}: errors {errors or '{}'}, cut off at drain {unfinished}"
                )
    return "\n".join(lines) if lines else "  none (no errors other than refusals, no call cut off)"


def paired(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-repeat ratios: repeat r of one side over repeat r of the other (they ran minutes apart at most)."""
    return [n / d if d > 0 else math.nan for n, d in zip(numerator, denominator, strict=False)]


def ratio_line(name: str, ratios: Sequence[float]) -> str:
    spread = Spread.of(ratios)
    return f"  {name}: {spread.format(2)}"


def target_line(target: Target) -> str:
    finite = [r for r in target.ratios if not math.isnan(r)]
    if not finite:
        return f"  [ n/a ] {target.name} (not measured)"
    median = statistics.median(finite)
    met = median <= target.bar if target.ceiling else median >= target.bar
    verdict = "MET" if met else "NOT MET"
    spread = Spread.of(finite)
    bound = "<=" if target.ceiling else ">="
    return f"  [{verdict:^7}] {target.name}: {spread.format(2)} (bar {bound} {target.bar})"


def draw(name: str, title: str, results: Results, labels: Mapping[str, str], raw: Sequence[float]) -> None:
    """The PNG beside the table: every side's ok/s (and the raw loop's items/s as the limit) and ok p99
    latency, against callers."""
    callers = sorted({c for by_callers in results.values() for c in by_callers})
    throughput: dict[str, dict[float, Sequence[float]]] = {
        "raw model loop (limit)": {c: raw for c in callers}
    }
    latency: dict[str, dict[float, Sequence[float]]] = {}
    for side, by_callers in results.items():
        throughput[labels[side]] = {c: [p.ok_per_s for p in points] for c, points in by_callers.items()}
        latency[labels[side]] = {c: [p.ok_p99_ms for p in points] for c, points in by_callers.items()}
    panels = [
        plot.Panel("answered calls/s", "calls/s", throughput),
        plot.Panel("ok p99 latency", "ms", latency),
    ]
    plot.draw(name, panels, x_label="closed-loop callers", title=title)
