"""One unary upstream call answered for an HTTP request, for any family whose route asks the server one
question (a tokenize, a count of tokens): the call's options from the request (the `X-Sluice-Priority`
header, the deadline shortened by `X-Sluice-Timeout-Ms`), the upstream's errors raised as ShimErrors (which
the family renders in its shape), the wait timed in the upstream-latency series `timed_as`, and the call
cancelled as soon as the client leaves.

    answer = await call_unary(request, lambda stub, options: stub.Tokenize(message(options), ...))
    if isinstance(answer, Response): return answer   # the client left
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sluice.inference.v1 import inference_pb2_grpc as pb_grpc
from starlette.requests import Request
from starlette.responses import Response

from shim.errors import upstream_errors
from shim.metrics import Timer, metrics_of
from shim.upstream.call_options import CallOptions, call_options
from shim.upstream.channel import settings_of, upstream_of
from shim.upstream.disconnect import ClientDisconnected, client_left, unless_disconnected

#: Starts the call on the InferenceService stub with the request's options (its timeout and priority).
Start = Callable[["pb_grpc.InferenceServiceAsyncStub", CallOptions], Any]


async def call_unary(
    request: Request,
    start: Start,
    *,
    json_field: Callable[[str], str] = str,
    timed_as: str | None = None,
) -> Any:
    """The call's answer, or the Response for a client that left (the call is cancelled then); the deadline
    is `--infer-timeout-s`'s, as for the shim's other unary calls."""
    settings = settings_of(request)
    options = call_options(None, request.headers, default_timeout_s=settings.infer_timeout_s)
    call = start(upstream_of(request).inference, options)
    timer: AbstractContextManager[object] = (
        nullcontext() if timed_as is None else Timer(metrics_of(request), timed_as)
    )
    try:
        with upstream_errors(json_field=json_field, reconnect_s=settings.reconnect_backoff_s), timer:
            return await unless_disconnected(request, call)
    except ClientDisconnected:
        call.cancel()
        response: Response = client_left(request)
        return response
