"""The hot path's metric updates (server/metric_children.py) export what prometheus_client's API does."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from server.metric_children import Observer, adder

BOUNDS = (0.0005, 0.001, 0.0025, 0.01, 1.0)
AMOUNTS = (0.0, 0.0005, 0.0007, 0.001, 0.003, 0.5, 1.0, 2.0, 1e-9, 7.0, 0.0025)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def _instruments(registry: CollectorRegistry) -> tuple[Counter, Gauge, Histogram]:
    return (
        Counter("calls_total", "c", ["model"], registry=registry),
        Gauge("in_flight", "g", ["model"], registry=registry),
        Histogram("wait_seconds", "h", ["model"], buckets=BOUNDS, registry=registry),
    )


def test_updates_export_the_same_samples_as_the_public_api() -> None:
    public, fast = CollectorRegistry(), CollectorRegistry()
    counter, gauge, histogram = (m.labels("mlp") for m in _instruments(public))
    fast_counter, fast_gauge, fast_histogram = (m.labels("mlp") for m in _instruments(fast))
    count, level, observer = adder(fast_counter), adder(fast_gauge), Observer(fast_histogram)
    for amount in AMOUNTS:
        counter.inc()
        count(1)
        gauge.inc()
        level(1)
        histogram.observe(amount)
        observer.observe(amount)
    gauge.dec()
    level(-1)
    expected, got = _samples(public), _samples(fast)
    assert got == expected
    assert expected[("in_flight", (("model", "mlp"),))] == len(AMOUNTS) - 1
    assert expected[("wait_seconds_bucket", (("le", "0.001"), ("model", "mlp")))] == 5  # le is inclusive


def test_nan_is_counted_in_the_sum_and_in_no_bucket_as_observe_does() -> None:
    public, fast = CollectorRegistry(), CollectorRegistry()
    (_, _, histogram), (_, _, fast_histogram) = _instruments(public), _instruments(fast)
    histogram.labels("m").observe(math.nan)
    Observer(fast_histogram.labels("m")).observe(math.nan)
    expected, got = _samples(public), _samples(fast)
    assert {k: v for k, v in got.items() if not math.isnan(v)} == {
        k: v for k, v in expected.items() if not math.isnan(v)
    }
    assert {k for k, v in got.items() if math.isnan(v)} == {k for k, v in expected.items() if math.isnan(v)}
