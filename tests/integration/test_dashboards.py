"""The Grafana dashboard (deploy/grafana/) and the Prometheus alert rules (deploy/prometheus/) against what
Sluice exports (issue 22, item 4 and acceptance 3): every query and rule names metrics and labels that a
live server and shim, scraped after real traffic, actually export; every rule and every dashboard query
parses with promtool; the Kubernetes manifests provision both as ConfigMaps, rendered from those files.
Issue 36: every alert has `promtool test rules` cases that pass (deploy/prometheus/tests/), and the dashboard
shows the engine (prefix cache, preemption, KV fragmentation and compaction, step gap)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from bench.prometheus import parse, total
from clients import SluiceClient
from tests.support.processes import ROOT, ServerProcess, ShimProcess, start_server, start_shim, wait_until

sys.path.insert(0, str(ROOT / "scripts"))
from render_observability import OUT, render

DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
RULES = sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))
# The engine's metrics the dashboard must chart (issue 36, item 9).
ENGINE = (
    "sluice_prefix_cache_hits_total",
    "sluice_prefix_cache_tokens_total",
    "sluice_preemptions_total",
    "sluice_recomputed_tokens_total",
    "sluice_kv_fragmentation",
    "sluice_kv_compactions_total",
    "sluice_kv_compaction_seconds_bucket",
    "sluice_step_gap_seconds_bucket",
)
TOKEN = "dashboard-tenant-token"
# Labels Prometheus adds or PromQL makes, never exported by a process.
NOT_EXPORTED = {"le", "instance", "job", "__name__"}
METRIC = re.compile(r"\bsluice_[a-z0-9_]+\b")
MATCHERS = re.compile(r"\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")


def dashboard_queries() -> list[str]:
    queries = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            queries += [target["expr"] for target in panel.get("targets", [])]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                queries.append(variable["definition"])
    return queries


def rule_expressions() -> list[str]:
    return [
        rule["expr"]
        for path in RULES
        for g in yaml.safe_load(path.read_text())["groups"]
        for rule in g["rules"]
    ]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        # Under `make test` this skip fails the run (tests/support/skips.py).
        pytest.skip("promtool (Debian prometheus) is not installed: make test-tools installs it")
    return found


def test_the_rules_and_every_dashboard_query_parse_with_promtool(tmp_path: Path) -> None:
    tool = promtool()
    for path in RULES:
        done = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    # Grafana's variables made concrete, each query as a recording rule: promtool parses them the same way.
    concrete = [
        q.replace("$__rate_interval", "5m").replace("$model", ".*")
        for q in dashboard_queries()
        if not q.startswith("label_values(")
    ]
    rules = [{"record": f"sluice:dashboard_query_{i}", "expr": q} for i, q in enumerate(concrete)]
    queries = tmp_path / "dashboard.yml"
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([tool, "check", "rules", str(queries)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(concrete) >= 20


def alerts() -> set[str]:
    return {
        rule["alert"]
        for path in RULES
        for g in yaml.safe_load(path.read_text())["groups"]
        for rule in g["rules"]
        if "alert" in rule
    }


def test_every_alert_has_promtool_cases_that_fire_and_pass() -> None:
    """`promtool test rules` over deploy/prometheus/tests/: every alert is evaluated there, and each has a
    case where it fires (the quiet cases, such as SluiceTokensForNobody on look-ahead discards alone, sit
    beside them in the same series)."""
    tool = promtool()
    cases = [
        case
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    assert alerts() - {case["alertname"] for case in cases} == set(), "alerts without a promtool case"
    assert alerts() - {case["alertname"] for case in cases if case.get("exp_alerts")} == set(), (
        "alerts no case expects to fire"
    )
    done = subprocess.run(
        [tool, "test", "rules", *(str(path) for path in RULE_TESTS)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_charts_the_engine() -> None:
    queried = set().union(*(names_and_labels(q)[0] for q in dashboard_queries()))
    assert [m for m in ENGINE if m not in queried] == []


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Every sample name a live server and shim export after traffic of every kind, with its label names."""
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        f'[[tenant]]\nname = "ops"\ntoken_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n'
    )
    server = start_server("--models", "mlp,byte-lm", "--auth-keys", str(keys))
    shim = start_shim(server.target, "--auth-keys", str(keys))
    try:
        drive(server, shim)
        samples = {**parse(httpx.get(f"{shim.url}/metrics", timeout=10).text), **server.metrics()}
    finally:
        shim.terminate()
        server.terminate()
    names: dict[str, set[str]] = {}
    for name, labels in samples:
        names.setdefault(name, set()).update(label for label, _ in labels)
    return names


def drive(server: ServerProcess, shim: ShimProcess) -> None:
    """Infer, Generate through the shim (twice: a prefix-cache hit), a refusal, a stream left early."""
    headers = {"authorization": f"Bearer {TOKEN}"}
    with SluiceClient(server.target, token=TOKEN) as client:
        client.infer("mlp", {"x": np.ones(512, np.float32)})
    body = {"model": "byte-lm", "prompt": "a prompt long enough to be cached " * 4, "max_tokens": 4}
    with httpx.Client(base_url=shim.url, headers=headers, timeout=30) as http:
        for _ in range(2):
            assert http.post("/v1/generate", json=body).status_code == 200
        chat = {"model": "byte-lm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        assert http.post("/v1/generate", json={**body, "model": "nope"}).status_code == 404
        with http.stream("POST", "/v1/generate", json={**body, "max_tokens": 500, "stream": True}) as stream:
            next(stream.iter_lines())  # then leave
    wait_until(
        lambda: (
            total(parse(httpx.get(f"{shim.url}/metrics", timeout=10).text), "sluice_shim_disconnects_total")
            > 0
        ),
        what="the shim counting the disconnect",
    )
    wait_until(
        lambda: server.metric("sluice_cached_prompt_tokens_total") > 0, what="a prefix-cache hit counted"
    )


def names_and_labels(expression: str) -> tuple[set[str], set[str]]:
    """The metric names an expression reads and the label names it matches or groups by."""
    labels: set[str] = set()
    for matchers in MATCHERS.findall(expression):
        labels |= set(MATCHER_LABEL.findall(matchers))
    for grouped in GROUPING.findall(expression):
        labels |= {label.strip() for label in grouped.split(",") if label.strip()}
    for _metric, label in LABEL_VALUES.findall(expression):
        labels.add(label)
    return set(METRIC.findall(expression)), labels - NOT_EXPORTED


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_query_names_metrics_and_labels_that_are_exported(
    exported: dict[str, set[str]], source: str
) -> None:
    expressions = dashboard_queries() if source == "dashboard" else rule_expressions()
    problems: list[str] = []
    for expression in expressions:
        metrics, labels = names_and_labels(expression)
        assert metrics, expression
        missing = sorted(m for m in metrics if m not in exported)
        if missing:
            problems.append(f"{missing} not exported: {expression}")
            continue
        known = set().union(*(exported[m] for m in metrics))
        if labels - known:
            problems.append(f"labels {sorted(labels - known)} not on {sorted(metrics)}: {expression}")
    assert not problems, "\n".join(problems)


def test_the_kubernetes_manifests_provision_both_as_config_maps() -> None:
    assert OUT.read_text() == render(), (
        "deploy/k8s/observability.yaml is stale: run scripts/render_observability.py"
    )
    maps: dict[str, Any] = {d["metadata"]["name"]: d for d in yaml.safe_load_all(OUT.read_text())}
    dashboards = maps["sluice-grafana-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    for path in DASHBOARDS:
        assert json.loads(dashboards["data"][path.name]) == json.loads(path.read_text())
    for path in RULES:
        assert maps["sluice-prometheus-rules"]["data"][path.name] == path.read_text()
