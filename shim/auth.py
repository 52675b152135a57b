"""Tokens at the shim: a request to the API must carry `Authorization: Bearer <token>` (or OpenAI's
Azure-style `api-key: <token>`) that the keys file knows (auth/keys.py), checked on its headers before
its body is read (401 in the route's error shape). The token then travels with the request's upstream
calls as `authorization` metadata, so that the server checks the same tenant, its models and quotas."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from grpc import aio
from starlette.datastructures import Headers

from auth.keys import TenantEntry, bearer_token, match
from shim.refusals import unauthenticated

#: The token of the request being served; the middleware sets it, the upstream interceptors read it.
FORWARDED_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("forwarded_token", default=None)


def check(entries: Sequence[TenantEntry], headers: Headers) -> tuple[str, TenantEntry]:
    """The request's token and its tenant in the keys file; raises the 401 ShimError otherwise."""
    authorization = headers.get("authorization")
    token = bearer_token(authorization) if authorization is not None else headers.get("api-key")
    if not token:
        raise unauthenticated("this API needs `Authorization: Bearer <token>` (or `api-key: <token>`)")
    entry = match(entries, token.strip())
    if entry is None:
        raise unauthenticated("the token is not one this server knows")
    return token.strip(), entry


def _with_token(details: Any) -> Any:
    token = FORWARDED_TOKEN.get()
    if token is None:
        return details
    metadata = [*(details.metadata or ()), ("authorization", f"Bearer {token}")]
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
