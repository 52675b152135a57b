"""The one plotting module of bench/: a report hands it what it printed (per side, per load point, one value
per repeat) and gets a PNG beside its table, one panel per measure (tokens/s, TTFT, latency, ...): the
median of the repeats as a line, their range as error bars. matplotlib's Agg backend, so no display is
needed; files go to bench/results/ (not committed) as `<bench>.png`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent / "results"

#: side -> load point (streams, callers) -> the value each repeat measured there.
Series = Mapping[str, Mapping[Any, Sequence[float]]]  # x: int or float


@dataclass(frozen=True, slots=True)
class Panel:
    """One measure against the load: every side a line; `log_x` for load points that double."""

    title: str
    y_label: str
    series: Series
    log_x: bool = True
    y_from_zero: bool = True
    notes: Sequence[str] = field(default_factory=tuple)


def draw(
    name: str, panels: Sequence[Panel], *, x_label: str, title: str, folder: Path | None = None
) -> Path | None:
    """Writes `<folder>/<name>.png` (bench/results/ by default) and prints where; None (and a line saying why)
    when there is nothing to draw, so that a report never fails on its plot."""
    drawn = [p for p in panels if any(_points(v) for v in p.series.values())]
    if not drawn:
        print(f"plot: nothing measured for {name}")
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, len(drawn), figsize=(5.6 * len(drawn), 4.2), squeeze=False)
    for axis, panel in zip(axes[0], drawn, strict=True):
        for label, by_x in panel.series.items():
            points = _points(by_x)
            if not points:
                continue
            xs = [x for x, _, _, _ in points]
            medians = [m for _, m, _, _ in points]
            below = [m - low for _, m, low, _ in points]
            above = [high - m for _, m, _, high in points]
            axis.errorbar(xs, medians, yerr=[below, above], marker="o", capsize=3, label=label)
        if panel.log_x:
            axis.set_xscale("log", base=2)
            ticks = sorted({x for by_x in panel.series.values() for x, *_ in _points(by_x)})
            axis.set_xticks(ticks, [f"{x:g}" for x in ticks])
        if panel.y_from_zero:
            axis.set_ylim(bottom=0)
        axis.set_title(panel.title, fontsize=10)
        axis.set_xlabel(x_label)
        axis.set_ylabel(panel.y_label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        for i, note in enumerate(panel.notes):
            axis.annotate(note, (0.02, 0.02 + 0.05 * i), xycoords="axes fraction", fontsize=7, alpha=0.8)
    figure.suptitle(f"{title}\nmedian of the repeats, bars: their range", fontsize=10)
    figure.tight_layout()
    out = (folder or FOLDER) / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    pyplot.close(figure)
    print(f"plot: {out}")
    return out


def _points(by_x: Mapping[float, Sequence[float]]) -> list[tuple[float, float, float, float]]:
    """(x, median, min, max) of each load point with a finite value, in order of x."""
    out = []
    for x, values in sorted(by_x.items()):
        finite = [v for v in values if not math.isnan(v)]
        if finite:
            out.append((x, statistics.median(finite), min(finite), max(finite)))
    return out
