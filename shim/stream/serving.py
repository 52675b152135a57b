"""One generation request served, for every API family that answers from Generate calls: the family builds
the calls from its parsed body and renders their answer; this runs them. The call options come from the
request (priority: the body's, else `X-Sluice-Priority`; deadline: `--generate-timeout-s`, shortened by
`X-Sluice-Timeout-Ms`), the calls start together, and shim.stream.consumer.respond() answers: the
family's collected answer, or its event stream, or the HTTP error of a call refused before its first
message.

    family route:  body = parse(...)
                   return await serve_generation(request, lambda priority: [...requests...],
                                                 stream=body.stream, answer=..., events=...)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from sluice.inference.v1 import inference_pb2 as pb
from starlette.requests import Request
from starlette.responses import Response

from clients.types import PriorityName
from shim.stream.consumer import Choice, Generations, respond
from shim.upstream.call_options import call_options
from shim.upstream.channel import settings_of, upstream_of

#: The family's Generate requests for one HTTP request, given the call's priority (None: the server's).
Requests = Callable[[PriorityName | None], Sequence[pb.GenerateRequest]]
#: The family's collected answer: every call read whole, as a Choice, in request order.
Answer = Callable[[list[Choice]], Response]
#: The family's server-sent events: its rendering of the calls' events, with heartbeats every `heartbeat_s`.
Events = Callable[[Generations, float], AsyncIterator[bytes]]


async def serve_generation(
    request: Request,
    requests: Requests,
    *,
    stream: bool,
    answer: Answer,
    events: Events,
    priority: PriorityName | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
    json_field: Callable[[str], str] = str,
    timed_as: str | None = None,
    media_type: str | None = None,
) -> Response:
    """The HTTP answer to one generation request: `priority` is the body's own (it wins over the header);
    `metadata` goes with every call; `json_field` names the server's proto paths in errors as the family's
    callers know them; `timed_as` names the upstream-latency series the wait for the first messages joins;
    `media_type` is the stream's where not `text/event-stream` (Ollama's `application/x-ndjson`)."""
    settings = settings_of(request)
    options = call_options(priority, request.headers, default_timeout_s=settings.generate_timeout_s)
    generations = Generations(
        upstream_of(request),
        requests(options.priority),
        timeout_s=options.timeout_s,
        reconnect_s=settings.reconnect_backoff_s,
        metadata=metadata,
        json_field=json_field,
    )
    heartbeat_s = settings.sse_heartbeat_s
    return await respond(
        request,
        generations,
        stream=stream,
        answer=answer,
        events=lambda calls: events(calls, heartbeat_s),
        timed_as=timed_as,
        media_type=media_type,
    )
