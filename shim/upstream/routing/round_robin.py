"""Round-robin routing: the pooled channel's own balancing over the replicas whose readiness is SERVING
(clients/channel.py); the default, and what the shim did before it had a choice."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc

from shim.upstream.routing.policy import GenerateCall


class RoundRobin:
    def __init__(self, inference: inference_pb2_grpc.InferenceServiceAsyncStub) -> None:
        self.inference = inference

    def generate(
        self, request: pb.GenerateRequest, *, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> GenerateCall:
        return self.inference.Generate(request, timeout=timeout, metadata=metadata)

    def finished(self, call: GenerateCall, timings: pb.GenerateTimings) -> None:
        pass

    async def close(self) -> None:
        pass  # the pooled channel is the Upstream's to close
