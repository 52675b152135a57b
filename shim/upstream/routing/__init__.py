"""How the shim's Generate calls are spread over the replicas (`--routing`): each policy is a module here
and one line in ROUTINGS. Other calls (Infer, the model list, tokenizing) always take the pooled channel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from sluice.inference.v1 import inference_pb2_grpc

from clients.targets import resolve_target
from shim.config import ShimSettings
from shim.upstream.routing.policy import GenerateCall, RoundRobin, Routing
from shim.upstream.routing.prefix import PrefixRouting, PrefixRules

__all__ = ["ROUTINGS", "GenerateCall", "Routing", "check_routing", "open_routing", "replica_addresses"]

OpenChannel = Callable[[str], grpc.aio.Channel]
#: (settings, the pooled channel's stub, a channel to one replica's address, the routed Counter) -> policy
Build = Callable[[ShimSettings, Any, OpenChannel, Any], Routing]


def replica_addresses(target: str) -> list[str]:
    """The replicas a target names, one `host:port` each; raises ValueError for a name the shim cannot
    enumerate itself (dns:///, xds:, unix:): prefix routing needs one channel per replica."""
    resolved = resolve_target(target)
    text = resolved.grpc_target
    if not resolved.balanced:
        if text.startswith(("unix:", "unix-abstract:")):
            raise ValueError(f"--routing prefix needs host:port replicas, not {target!r}")
        return [text]
    for scheme in ("ipv4:", "ipv6:"):
        if text.startswith(scheme):
            return text[len(scheme) :].split(",")
    raise ValueError(f"--routing prefix needs a list of host:port replicas, not {target!r}")


def _prefix(
    settings: ShimSettings,
    inference: inference_pb2_grpc.InferenceServiceAsyncStub,
    open_channel: OpenChannel,
    routed: Any,
) -> Routing:
    rules = PrefixRules(
        block_bytes=settings.routing_block_bytes,
        index_blocks=settings.routing_index_blocks,
        min_match=settings.routing_min_match,
        imbalance=settings.routing_imbalance,
        imbalance_calls=settings.routing_imbalance_calls,
        imbalance_wait_s=settings.routing_imbalance_wait_s,
        probe_s=settings.routing_probe_s,
    )
    return PrefixRouting(replica_addresses(settings.upstream), open_channel, rules, routed=routed)


ROUTINGS: dict[str, Build] = {
    "round_robin": lambda settings, inference, open_channel, routed: RoundRobin(inference),
    "prefix": _prefix,
}


def check_routing(settings: ShimSettings) -> None:
    """Raises ValueError naming the setting where `--routing` cannot serve the target (at start-up)."""
    if settings.routing not in ROUTINGS:
        raise ValueError(f"invalid setting routing: {settings.routing!r}; one of {', '.join(ROUTINGS)}")
    if settings.routing == "prefix":
        replica_addresses(settings.upstream)


def open_routing(
    settings: ShimSettings,
    inference: inference_pb2_grpc.InferenceServiceAsyncStub,
    open_channel: OpenChannel,
    routed: Any = None,
) -> Routing:
    return ROUTINGS[settings.routing](settings, inference, open_channel, routed)
