"""OpenAI's server-sent events, rendered from the shim's one stream consumer (shim.stream.consumer):
`data: {json}` per chunk, `: ping` on a quiet stream, `data: [DONE]` at the end, an error as a data event
holding `{"error": ...}` (which the SDKs raise); and what both APIs' answers share: the usage totals and a
token's text in log-probability listings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from shim import jsonio
from shim.errors import ErrorBody, ShimError
from shim.openai_errors import openai_error_json
from shim.request_metrics import request_metrics
from shim.stream.consumer import Generations, Piece
from shim.stream.paced import Heartbeat
from shim.stream.sse import PING

DONE = b"data: [DONE]\n\n"


def data_event(payload: Any) -> bytes:
    return b"data: " + jsonio.dumps(payload) + b"\n\n"


def error_event(error: ErrorBody) -> bytes:
    return data_event(openai_error_json(ShimError(error)))


def usage_json(usages: Mapping[int, pb.Usage], *, n: int) -> dict[str, Any]:
    """Totals over the choices (by choice index): the n choices of one prompt (indices p*n .. p*n+n-1) share
    its prompt tokens, which count once, and so their cached tokens (OpenAI's prompt_tokens_details)."""
    completion = sum(u.completion_tokens for u in usages.values())
    prompt = sum(u.prompt_tokens for index, u in usages.items() if index % n == 0)
    cached = sum(u.cached_tokens for index, u in usages.items() if index % n == 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def choice_events(
    generations: Generations,
    head: Mapping[str, Any],
    render: Callable[[Piece], Iterable[bytes]],
    *,
    heartbeat_s: float,
    n: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Both APIs' stream after its opening: heartbeats pass through, an error (a failed call, or a choice
    that ended with one) ends it as an error event, `render` writes each piece's chunks, then the usage
    chunk where asked for (with the request's `metrics`, as vLLM's) and [DONE]."""
    usages: dict[int, pb.Usage] = {}
    timings: list[pb.GenerateTimings] = []
    async for item in generations.events(heartbeat_s=heartbeat_s):
        if isinstance(item, Heartbeat):
            yield PING
            continue
        if item.error is not None:  # a failed call, or a choice that ended with an error
            yield error_event(item.error)
            return
        for event in render(item):
            yield event
        if item.finish_reason is not None:  # a choice's last piece
            usages[item.index] = item.usage
            timings.append(item.timings)
    usage = usage_json(usages, n=n)
    metrics = request_metrics(usage, timings, model=str(head.get("model", "")))
    if include_usage:
        yield data_event({**head, "choices": [], "usage": usage, "metrics": metrics})
    yield DONE


def token_text(token: bytes) -> str:
    """A token's text for log-probability listings: a token holding part of a character shows U+FFFD."""
    return token.decode("utf-8", errors="replace")
