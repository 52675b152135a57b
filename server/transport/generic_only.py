"""GenericOnly: lets the generated `add_*Servicer_to_server` functions register a servicer on a lone grpc.aio
server through its generic handler alone, not also method by method.

grpc.aio (grpcio 1.85) keeps one pending request-call task per registered method, and its server loop
awaits `asyncio.wait` over all of them twice a call: with the 29 methods of Sluice's three services, each
call walked ~30 tasks (an `iscoroutine` check, `add_done_callback` and `remove_done_callback` each), about
half of the Python calls the event loop made per Infer call that a plain grpc.aio server does not. With
generic handlers only there is one such task; the method is then found by a dict lookup per service. The
front-end pool (server/frontends/) keeps the registered methods: it dispatches by them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc


class GenericOnly:
    """The two registration methods the generated code calls, forwarded to `server` as generic handlers."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler[Any, Any]]) -> None:
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        """Not registered by name: the generated code has registered the same methods in the generic
        handler it passed to add_generic_rpc_handlers just before."""
