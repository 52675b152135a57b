"""The seam between the shim's Generate calls and the replicas: a routing policy starts each call on the
replica it chooses, and hears the server's timings of each call that finished. `--routing` names one of
`shim.upstream.routing.ROUTINGS`; a policy of another kind is one module there and one line in that table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc
from sluice.inference.v1 import inference_pb2 as pb

GenerateCall = grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]


class Routing(Protocol):
    def generate(
        self, request: pb.GenerateRequest, *, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> GenerateCall:
        """Starts the call on the chosen replica."""

    def finished(self, call: GenerateCall, timings: pb.GenerateTimings) -> None:
        """The call's final message came, with the server's timings (its queue wait: the replica's load)."""

    async def close(self) -> None:
        """Ends what the policy runs of its own (channels, probes)."""
