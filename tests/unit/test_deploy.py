"""The deployment artefacts agree with the server they deploy: every Kubernetes manifest passes the
Kubernetes schemas (kubernetes-validate --strict), probes name the health services the server serves,
grace periods cover the drain, the shim balances over the headless Service, the autoscaler's metric is
one the server exports, and the image is built by the README's set-up."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from clients.channel import READINESS_SERVICE as READINESS
from clients.targets import resolve_target

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def documents() -> list[dict[str, Any]]:
    return [d for path in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_manifest_passes_the_kubernetes_schemas() -> None:
    validate = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    if validate is None:
        pytest.fail("kubernetes-validate is not installed (requirements.lock pins it)")
    files = sorted(str(p) for p in K8S.glob("*.yaml"))
    done = subprocess.run([validate, "--strict", "--quiet", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_server_probes_and_grace_match_the_server() -> None:
    servers = [
        d for d in of_kind("Deployment") if "server" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    ]
    assert len(servers) == 2  # CPU and CUDA
    for deployment in servers:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        port = int(flag(container["args"], "--port"))
        assert container["readinessProbe"]["grpc"] == {"port": port, "service": READINESS}
        assert container["livenessProbe"]["grpc"] == {"port": port, "service": ""}
        assert container["startupProbe"]["grpc"]["service"] == ""
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        grace = float(flag(container["args"], "--grace-s"))
        assert pod["terminationGracePeriodSeconds"] >= pre_stop + grace + 5


def test_the_shim_balances_over_the_headless_service() -> None:
    (headless,) = [s for s in of_kind("Service") if s["spec"].get("clusterIP") == "None"]
    (shim,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "sluice-shim"]
    upstream = flag(shim["spec"]["template"]["spec"]["containers"][0]["args"], "--upstream")
    assert upstream.startswith(f"dns:///{headless['metadata']['name']}.")
    assert upstream.endswith(f":{headless['spec']['ports'][0]['port']}")
    assert resolve_target(upstream).balanced


def test_the_autoscaler_scales_on_a_metric_the_server_exports() -> None:
    (hpa,) = of_kind("HorizontalPodAutoscaler")
    name = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert f'"{name}"' in (ROOT / "server" / "metrics.py").read_text()
    assert of_kind("PodDisruptionBudget")


def test_the_image_is_built_by_the_readme_set_up_with_the_pinned_torch() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "make setup" in dockerfile
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    assert pinned is not None and pinned.group(1).startswith("2.13.0")
    assert f"ARG TORCH=torch=={pinned.group(1)}" in dockerfile


# The Inference Gateway (issue 33): deploy/k8s/inference-gateway/, beside the plain manifests.
GATEWAY = K8S / "inference-gateway"


def gateway_documents() -> list[dict[str, Any]]:
    return [d for path in sorted(GATEWAY.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def picker_configs() -> list[dict[str, Any]]:
    return [
        yaml.safe_load(d["data"]["config.yaml"])
        for d in gateway_documents()
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("endpoint-picker")
    ]


def test_the_gateway_core_kinds_pass_the_kubernetes_schemas(tmp_path: Path) -> None:
    validate = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    if validate is None:
        pytest.fail("kubernetes-validate is not installed (requirements.lock pins it)")
    core = [d for d in gateway_documents() if "." not in d["apiVersion"].split("/")[0]]  # v1, apps/v1
    assert {d["kind"] for d in core} == {"Deployment", "ConfigMap"}
    files = []
    for index, document in enumerate(core):
        files.append(tmp_path / f"{index}.yaml")
        files[-1].write_text(yaml.safe_dump(document))
    done = subprocess.run([validate, "--strict", "--quiet", *map(str, files)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pools_select_the_pods_their_ports_and_the_pickers_mapping() -> None:
    from server import protocol_metrics

    (deployment,) = [d for d in gateway_documents() if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    server, shim = pod["spec"]["containers"]
    ports = {p["containerPort"] for c in (server, shim) for p in c["ports"]}
    assert flag(shim["args"], "--upstream") == f"127.0.0.1:{flag(server['args'], '--port')}"  # its own server
    pools = {d["metadata"]["name"]: d["spec"] for d in gateway_documents() if d["kind"] == "InferencePool"}
    assert set(pools) == {"sluice-http", "sluice-grpc"}
    for spec in pools.values():
        assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert {p["number"] for p in spec["targetPorts"]} <= ports
    assert pools["sluice-http"]["targetPorts"] == [{"number": int(flag(shim["args"], "--port"))}]
    assert pools["sluice-grpc"]["targetPorts"] == [{"number": int(flag(server["args"], "--port"))}]
    assert pools["sluice-grpc"]["appProtocol"] == "kubernetes.io/h2c"
    exported = {protocol_metrics.WAITING, protocol_metrics.RUNNING, protocol_metrics.KV_USAGE}
    exported.add(protocol_metrics.CACHE_INFO)
    configs = picker_configs()
    assert len(configs) == len(pools)
    for config in configs:
        plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
        assert plugins["metrics-data-source"]["port"] == int(flag(server["args"], "--metrics-port"))
        (engine,) = plugins["core-metrics-extractor"]["engineConfigs"]
        assert pod["metadata"]["labels"]["llm-d.ai/engine-type"] == engine["name"]
        specs = [
            engine[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec")
        ]
        assert set(specs) == exported
        refs = [r["pluginRef"] for p in config["schedulingProfiles"] for r in p["plugins"]]
        refs += [r["pluginRef"] for r in config["requestHandler"]["parsers"]]
        assert set(refs) <= set(plugins)


def test_the_crd_validator_refuses_what_the_schema_refuses(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from validate_inference_pool import validate
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "spec": {"group": "example.io", "names": {"kind": "Pool"}, "versions": [{"name": "v1", "schema": {
            "openAPIV3Schema": {"type": "object", "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                "spec": {"type": "object", "required": ["mode"], "properties": {
                    "mode": {"type": "string", "enum": ["a", "b"]}}}}}}}]},
    }  # fmt: skip
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump(crd))
    good = {"apiVersion": "example.io/v1", "kind": "Pool", "metadata": {"name": "p"}, "spec": {"mode": "a"}}
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    assert validate([tmp_path / "crd.yaml"], [tmp_path / "good.yaml"]) == []
    bad = {**good, "spec": {"mode": "c", "extra": 1}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    failures = validate([tmp_path / "crd.yaml"], [tmp_path / "bad.yaml"])
    assert len(failures) == 2 and "'c' is not one of" in " ".join(failures) and "extra" in " ".join(failures)
    assert validate([tmp_path / "crd.yaml"], [GATEWAY / "inference-pool.yaml"]) == [
        "no custom resource of the given CRDs was found"
    ]
