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
