"""Targets: one server stays as written, lists of replicas become one balanced gRPC target, names pass."""

from __future__ import annotations

import json

import pytest

from clients.channel import ChannelSettings, channel_options
from clients.targets import Target, resolve_target


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("127.0.0.1:50051", Target("127.0.0.1:50051", False)),
        ("localhost:50051", Target("localhost:50051", False)),
        ("10.0.0.1:1, 10.0.0.2:2", Target("ipv4:10.0.0.1:1,10.0.0.2:2", True)),
        ("localhost:7,127.0.0.2:8", Target("ipv4:127.0.0.1:7,127.0.0.2:8", True)),
        ("[::1]:5,[::2]:6", Target("ipv6:[::1]:5,[::2]:6", True)),
        ("dns:///sluice-headless.ns.svc:50051", Target("dns:///sluice-headless.ns.svc:50051", True)),
        ("unix:/run/sluice.sock", Target("unix:/run/sluice.sock", False)),
    ],
)
def test_targets(target: str, expected: Target) -> None:
    assert resolve_target(target) == expected


@pytest.mark.parametrize("target", ["a:1,b", "127.0.0.1:1,127.0.0.1:99999", "127.0.0.1:1,[::1]:2", ",:"])
def test_a_bad_list_names_the_target(target: str) -> None:
    with pytest.raises(ValueError, match="target"):
        resolve_target(target)


def test_only_replicas_are_balanced_and_health_checked() -> None:
    def config(balanced: bool) -> dict[str, object]:
        options = dict(channel_options(ChannelSettings(), balanced=balanced))
        return json.loads(str(options["grpc.service_config"]))  # type: ignore[no-any-return]

    assert "loadBalancingConfig" not in config(False) and "healthCheckConfig" not in config(False)
    assert config(True)["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config(True)["healthCheckConfig"] == {"serviceName": "sluice.readiness"}
    assert config(True)["methodConfig"] == config(False)["methodConfig"]  # the same retries either way
