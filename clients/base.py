"""ClientBase: everything the blocking and the asyncio clients share but I/O (as httpx's BaseClient): the
default deadline, the token's metadata, and the request messages. `clients.sync` and `clients.aio` add
only the stub calls and their streams."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from sluice.inference.v1 import inference_pb2 as pb

from clients.channel import ChannelSettings, check_timeout
from clients.messages import build_generate_request, build_infer_request
from clients.types import ChatMessage, PriorityName
from wire.metadata import AUTHORIZATION
from wire.sampling import Sampling

Prompt = str | Sequence[int] | Sequence[ChatMessage]


class ClientBase:
    """`timeout` is the default deadline, in seconds, of every call (None: no deadline); each method's
    `timeout` argument overrides it for that call. `token`: a server started with --auth-keys wants it on
    every call (as `authorization: Bearer`)."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 30.0,
        settings: ChannelSettings | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        self._timeout = check_timeout(timeout)
        self._metadata = ((AUTHORIZATION, f"Bearer {token}"),) if token is not None else None
        self._open(target, settings or ChannelSettings(), credentials)

    def _open(
        self, target: str, settings: ChannelSettings, credentials: grpc.ChannelCredentials | None
    ) -> None:
        """Opens the channel and its stub: the one thing the blocking and the asyncio clients do apart."""
        raise NotImplementedError

    def _deadline(self, timeout: float | None) -> float | None:
        return self._timeout if timeout is None else check_timeout(timeout)

    _infer_request = staticmethod(build_infer_request)

    @staticmethod
    def _generate_request(
        model: str,
        prompt: Prompt,
        sampling: Sampling | None,
        fields: Mapping[str, Any],
        priority: PriorityName | None,
        request_id: str | None,
    ) -> pb.GenerateRequest:
        return build_generate_request(
            model, prompt, sampling=sampling, priority=priority, request_id=request_id, **fields
        )
