"""POST /v1/completions: each prompt (text or token ids) gets n Generate calls; choice p*n+i is prompt p's
i-th. The answer is a `text_completion`, or a stream of them ending with `data: [DONE]`; log-probabilities
come in the legacy shape (tokens, token_logprobs, top_logprobs, text_offset)."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from sluice.inference.v1 import inference_pb2 as pb

from clients.messages import build_generate_request
from shim.identity import current_request_id
from shim.openai.request_models import CompletionRequest
from shim.openai.streaming import choice_events, data_event, token_text, usage_json
from shim.stream.consumer import Choice, Generations, Piece


def generate_requests(body: CompletionRequest, *, request_id: str, priority: Any) -> list[pb.GenerateRequest]:
    constraint = body.constraint()
    return [
        build_generate_request(
            body.model,
            prompt,
            sampling=body.to_sampling(choice=i),
            priority=priority,
            request_id=f"{request_id}-{p}-{i}",
            constraint=constraint,
        )
        for p, prompt in enumerate(body.prompts)
        for i in range(body.n)
    ]


def new_id() -> str:
    """As vLLM's: the caller's X-Request-Id where it sent one, under the OpenAI object's prefix."""
    return f"cmpl-{current_request_id() or secrets.token_hex(12)}"


def _logprobs(entries: Sequence[pb.TokenLogprob], wanted: int | None, offset: int) -> dict[str, Any] | None:
    if wanted is None:
        return None
    tokens = [token_text(e.chosen.token) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [e.chosen.logprob for e in entries],
        "top_logprobs": [{token_text(t.token): t.logprob for t in e.top} for e in entries]
        if wanted
        else None,
        "text_offset": offsets,
    }


def completion(body: CompletionRequest, choices: list[Choice], *, request_id: str) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": _logprobs(c.logprobs, body.logprobs, 0),
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_json({c.index: c.usage for c in choices}, n=body.n),
    }


async def chunks(
    body: CompletionRequest, generations: Generations, *, request_id: str, heartbeat_s: float
) -> AsyncIterator[bytes]:
    """The SSE stream; the caller's response runs `generations.cancel()` however it ends."""
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": body.model}
    offsets = [0] * len(generations.calls)

    def render(piece: Piece) -> Iterator[bytes]:
        logprobs = _logprobs(piece.logprobs, body.logprobs, offsets[piece.index])
        offsets[piece.index] += len(piece.text)
        if piece.text or piece.finish_reason is not None:
            choice = {
                "index": piece.index,
                "text": piece.text,
                "logprobs": logprobs,
                "finish_reason": piece.finish_reason,
            }
            yield data_event({**head, "choices": [choice]})

    events = choice_events(
        generations, head, render, heartbeat_s=heartbeat_s, n=body.n, include_usage=body.include_usage
    )
    async for chunk in events:
        yield chunk
