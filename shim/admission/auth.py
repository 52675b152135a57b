"""Tokens at the shim: a request to the API must carry a token the keys file knows (auth/keys.py) in one of
the headers its API family accepts (`Families.attach(token_headers=...)`; by default `Authorization: Bearer
<token>`, or OpenAI's Azure-style `api-key: <token>`), checked on its headers before its body is read (401
in the route's error shape). The token then travels with the request's upstream calls as `authorization`
metadata (shim.upstream.forwarding), so that the server checks the same tenant, its models and quotas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.datastructures import Headers

from auth.keys import TenantEntry, match
from shim.refusals import unauthenticated
from wire.metadata import API_KEY_HEADER, AUTHORIZATION


@dataclass(frozen=True, slots=True)
class TokenHeader:
    """A request header that carries a caller's token: after `scheme` (`Authorization: Bearer <token>`), or
    the whole value when `scheme` is None (`api-key: <token>`). `name` is spelled as the API documents it."""

    name: str
    scheme: str | None = None

    @property
    def key(self) -> str:
        """The header's name as HTTP/2 and ASGI carry it (lowercase)."""
        return self.name.lower()

    def token(self, value: str) -> str | None:
        if self.scheme is None:
            return value
        scheme, _, token = value.partition(" ")  # as auth.keys.bearer_token reads `Bearer <token>`
        token = token.strip()
        return token if scheme.lower() == self.scheme.lower() and token else None

    def shown(self) -> str:
        return f"`{self.name}: {self.scheme} <token>`" if self.scheme else f"`{self.name}: <token>`"


BEARER = TokenHeader(AUTHORIZATION.capitalize(), scheme="Bearer")
AZURE_API_KEY = TokenHeader(API_KEY_HEADER)
#: What a family that declares none accepts: the standard header, then Azure OpenAI's (the OpenAI SDKs').
DEFAULT_TOKEN_HEADERS: tuple[TokenHeader, ...] = (BEARER, AZURE_API_KEY)


def needs(accepted: Sequence[TokenHeader]) -> str:
    first, *others = accepted
    alternatives = " or ".join(header.shown() for header in others)
    return f"this API needs {first.shown()}" + (f" (or {alternatives})" if others else "")


def check(
    entries: Sequence[TenantEntry],
    headers: Headers,
    accepted: Sequence[TokenHeader] = DEFAULT_TOKEN_HEADERS,
) -> tuple[str, TenantEntry]:
    """The request's token and its tenant in the keys file; raises the 401 ShimError otherwise. The first
    of the `accepted` headers that the request carries is the one read (a malformed one is not passed over
    for the next: a caller that sent a credential learns it was wrong)."""
    token = None
    for header in accepted:
        value = headers.get(header.key)
        if value is not None:
            token = header.token(value)
            break
    if not token:
        raise unauthenticated(needs(accepted))
    entry = match(entries, token.strip())
    if entry is None:
        raise unauthenticated("the token is not one this server knows")
    return token.strip(), entry
