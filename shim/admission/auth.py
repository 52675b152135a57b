"""Tokens at the shim: a request to the API must carry `Authorization: Bearer <token>` (or OpenAI's
Azure-style `api-key: <token>`) that the keys file knows (auth/keys.py), checked on its headers before
its body is read (401 in the route's error shape). The token then travels with the request's upstream
calls (shim.upstream.forwarding), so that the server checks the same tenant, its models and quotas."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers

from auth.keys import TenantEntry, bearer_token, match
from shim.refusals import unauthenticated
from wire.metadata import API_KEY_HEADER, AUTHORIZATION


def check(entries: Sequence[TenantEntry], headers: Headers) -> tuple[str, TenantEntry]:
    """The request's token and its tenant in the keys file; raises the 401 ShimError otherwise."""
    authorization = headers.get(AUTHORIZATION)
    token = bearer_token(authorization) if authorization is not None else headers.get(API_KEY_HEADER)
    if not token:
        raise unauthenticated("this API needs `Authorization: Bearer <token>` (or `api-key: <token>`)")
    entry = match(entries, token.strip())
    if entry is None:
        raise unauthenticated("the token is not one this server knows")
    return token.strip(), entry
