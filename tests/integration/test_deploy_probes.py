"""The Kubernetes probes of deploy/k8s/server.yaml asked of a server started with the manifest's own
arguments (ports moved to free ones): startup and liveness on "" and readiness on sluice.readiness answer
SERVING, on the port the manifest probes (issue 13, acceptance 3)."""

from __future__ import annotations

from pathlib import Path

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.processes import ROOT, spawn, wait_until

MANIFEST = ROOT / "deploy" / "k8s" / "server.yaml"


def test_the_manifests_probes_pass_against_a_server_run_as_it_says(tmp_path: Path) -> None:
    (deployment,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = list(container["args"])
    assert args[:3] == [".venv/bin/python", "-m", "server"]
    port = int(args[args.index("--port") + 1])
    probes = [container[k]["grpc"] for k in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert {p["port"] for p in probes} == {port}
    ports = {p["containerPort"] for p in container["ports"]}
    assert port in ports and int(args[args.index("--metrics-port") + 1]) in ports
    # The manifest's arguments, on free ports and loopback, with the small embedded models.
    args[args.index("--port") + 1] = "0"
    args[args.index("--metrics-port") + 1] = "0"
    args[args.index("--host") + 1] = "127.0.0.1"
    server = spawn("server", [*args[1:], "--models", "mlp", "--log-level", "WARNING"])
    try:
        listening = server.wait_for_line(r"listening on 127\.0\.0\.1:(\d+)")
        target = f"127.0.0.1:{listening.group(1)}"
        server.wait_for_line("sluice server ready")
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            def status(service: str) -> int:
                request = health_pb2.HealthCheckRequest(service=service)
                return int(health.Check(request, timeout=5).status)

            for probe in probes:
                wait_until(
                    lambda probe=probe: status(probe["service"]) == health_pb2.HealthCheckResponse.SERVING,
                    what=f"the probe on {probe['service']!r} passing",
                )
    finally:
        assert server.terminate() == 0, server.diagnostics()
