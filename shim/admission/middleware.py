"""The ASGI middleware that admits API requests to the shim's in-flight bound (shim.admission.bound).

Which requests are the API, in whose error shape a refusal is answered and which headers carry a token, it
asks the family registry (shim.families): it knows no family and no path of its own.

A request is refused with 503 SHIM_OVERLOADED at once when every slot is held, before its body is read.
A POST's body must declare JSON (415 otherwise) and is then read in full, within `max_body_bytes` (413)
and `body_timeout_s` (408), before the request takes a slot: a client that sends its body slowly, or
never, waits on its own connection without holding a slot that real work needs. The slot is held until
the response, SSE streams included, has ended. Routes then parse the bytes read here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from auth.keys import TenantEntry
from process.access_log import AccessLog
from shim.admission.auth import check
from shim.admission.bound import InflightBound
from shim.admission.request_body import ClientLeft, check_json_media_type, read_body
from shim.errors import ShimError
from shim.families import Families
from shim.identity import (
    CACHE_SALT,
    FORWARDED_TOKEN,
    REQUEST_ID,
    REQUEST_ID_HEADER,
    TENANT,
    TENANT_HEADER,
    request_id_from,
)
from shim.refusals import shim_overloaded
from shim.request_metrics import LOG_FIELDS


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands the app the body already read, then whatever the client does next
    (its disconnect), so routes can both read the body and watch for the client leaving."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class AdmissionMiddleware:
    """Wraps the app: the decision to refuse, and the reading of the body, come before routing."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        bound: InflightBound,
        families: Families,
        max_body_bytes: int,
        body_timeout_s: float,
        keys: Sequence[TenantEntry] | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.access_log = access_log or AccessLog(0.0)
        self.bound = bound
        self.families = families
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Probes must answer even when the shim is saturated, so only the API counts.
        if scope["type"] != "http" or not self.families.in_api(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = request_id_from(headers)
        REQUEST_ID.set(request_id)
        identity = [(REQUEST_ID_HEADER.encode(), request_id.encode())]
        log = _Line(self.access_log, scope, request_id) if self.access_log.sampled() else None
        LOG_FIELDS.set(None if log is None else log.fields)  # the routes add the tokens and timings
        send = _identified(send, identity, log)
        try:
            if self.keys is not None:  # on the headers alone: a refused body is never read nor parsed
                token, tenant = check(self.keys, headers, self.families.token_headers(scope))
                FORWARDED_TOKEN.set(token)
                TENANT.set(tenant.name)
                CACHE_SALT.set(tenant.cache_salt)
                identity.append((TENANT_HEADER.encode(), tenant.name.encode()))
                if log is not None:
                    log.fields["tenant"] = tenant.name
            if self.bound.full:
                raise shim_overloaded(self.bound.limit)
            # Every POST of the API carries a JSON body; the other methods carry none.
            if scope["method"] == "POST":
                (self.families.media_check(scope) or check_json_media_type)(headers)
                body = await read_body(
                    receive, headers, limit=self.max_body_bytes, timeout_s=self.body_timeout_s
                )
                receive = _replaying(body, receive)
            # Slots may have filled while the body arrived.
            if not self.bound.try_acquire():
                raise shim_overloaded(self.bound.limit)
        except ShimError as error:
            await self.families.render(scope, error)(scope, receive, send)
            if log is not None:
                log.write()
            return
        except ClientLeft:
            return  # nobody to answer; uvicorn knows the connection is gone
        try:
            await self.app(scope, receive, send)
        finally:
            self.bound.release()
            if log is not None:
                log.write()


class _Line:
    """The shim's access-log line of one request: method, path, status, request id, tenant, duration."""

    def __init__(self, log: AccessLog, scope: Scope, request_id: str) -> None:
        self.log, self.started = log, time.monotonic()
        self.fields: dict[str, object] = {
            "method": scope["method"],
            "path": scope["path"],
            "request_id": request_id,
            "status": None,
        }

    def write(self) -> None:
        self.fields["duration_ms"] = round((time.monotonic() - self.started) * 1000, 3)
        self.log.write(**self.fields)


def _identified(send: Send, identity: list[tuple[bytes, bytes]], log: _Line | None) -> Send:
    """A send() that adds the request id and tenant to the response's headers (errors and streams too)."""

    async def identified(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *identity]}
            if log is not None:
                log.fields["status"] = message["status"]
        await send(message)

    return identified
