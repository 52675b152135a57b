"""The seam between the shim's Generate calls and the replicas: a routing policy starts each call on the
replica it chooses, and hears the server's timings of each call that finished. `--routing` names one of
`shim.upstream.routing.ROUTINGS`; a policy of another kind is one module there and one line in that table.
The default, round-robin, is here: the pooled channel's own balancing over the replicas whose readiness is
SERVING (clients/channel.py), what the shim did before it had a choice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc

GenerateCall = grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]


class Routing(Protocol):
    def generate(
        self, request: pb.GenerateRequest, *, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> GenerateCall:
        """Starts the call on the chosen replica."""

    def finished(
        self, call: GenerateCall, timings: pb.GenerateTimings, usage: pb.Usage | None = None
    ) -> None:
        """The call's final message came, with the server's timings (the replica's load, as it saw it) and
        its usage (the cached tokens: what of the prompt the replica still held)."""

    async def close(self) -> None:
        """Ends what the policy runs of its own (channels, probes)."""


class RoundRobin:
    def __init__(self, inference: inference_pb2_grpc.InferenceServiceAsyncStub) -> None:
        self.inference = inference

    def generate(
        self, request: pb.GenerateRequest, *, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> GenerateCall:
        return self.inference.Generate(request, timeout=timeout, metadata=metadata)

    def finished(
        self, call: GenerateCall, timings: pb.GenerateTimings, usage: pb.Usage | None = None
    ) -> None:
        pass

    async def close(self) -> None:
        pass  # the pooled channel is the Upstream's to close
