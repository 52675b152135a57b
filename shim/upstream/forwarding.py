"""The upstream channel's interceptors that add the served request's token to each call as `authorization`
metadata (set by the admission middleware in shim.identity.FORWARDED_TOKEN), so that the server checks the
same tenant, its models and quotas."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpc import aio

from shim.identity import FORWARDED_TOKEN
from wire.metadata import AUTHORIZATION


def _with_token(details: Any) -> Any:
    token = FORWARDED_TOKEN.get()
    if token is None:
        return details
    metadata = [*(details.metadata or ()), (AUTHORIZATION, f"Bearer {token}")]
    return details._replace(metadata=metadata)


if TYPE_CHECKING:
    _UnaryUnaryBase = aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStreamBase = aio.UnaryStreamClientInterceptor[Any, Any]
else:  # the runtime classes are not generic; only the type stubs are
    _UnaryUnaryBase = aio.UnaryUnaryClientInterceptor
    _UnaryStreamBase = aio.UnaryStreamClientInterceptor


class _UnaryUnary(_UnaryUnaryBase):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(_with_token(details), request)


class _UnaryStream(_UnaryStreamBase):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(_with_token(details), request)


def forwarding_interceptors() -> list[Any]:
    """Interceptors for the upstream channel that add the served request's token to each call."""
    return [_UnaryUnary(), _UnaryStream()]
