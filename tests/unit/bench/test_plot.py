"""bench/plot.py: a report's figures as a PNG (Agg, no display), one panel per measure, the median of the
repeats with their range; nothing measured draws nothing rather than failing the report."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from bench import plot


def test_a_report_gets_a_png_with_one_panel_per_measure(tmp_path: Path) -> None:
    throughput = {
        "raw loop": {1: [280.0, 290.0], 8: [1270.0], 32: [2450.0, 2400.0, 2500.0]},
        "sluice": {8: [1100.0]},
    }
    ttft = {"sluice p50": {1: [12.0], 8: [37.0], 32: [97.0]}}
    panels = [plot.Panel("tokens/s", "tokens/s", throughput), plot.Panel("TTFT", "ms", ttft)]
    out = plot.draw("example", panels, x_label="streams", title="an example", folder=tmp_path)
    assert out == tmp_path / "example.png"
    with Image.open(out) as image:
        assert image.format == "PNG"
        width, height = image.size
    one = plot.draw("one", panels[:1], x_label="streams", title="one panel", folder=tmp_path)
    assert one is not None
    with Image.open(one) as image:
        assert image.size[0] < width and image.size[1] == height  # two panels side by side: twice as wide


def test_nothing_measured_draws_nothing(tmp_path: Path) -> None:
    empty = plot.Panel("tokens/s", "tokens/s", {"sluice": {8: [float("nan")]}})
    assert plot.draw("empty", [empty], x_label="streams", title="nothing", folder=tmp_path) is None
    assert not list(tmp_path.iterdir())
