"""What one HTTP request cost on the server, for every API family: the per-request `metrics` object (vLLM's
names: queue time, time to first token, generation time, inter-token latency, tokens per second) built from
the server's GenerateTimings, and the same figures and token counts in the shim's access-log line.

With several calls behind one request (n > 1, or several prompts) the figures describe the request as its
caller saw it: the longest queue wait, the earliest first token, the longest generation, and the rate of
all the tokens over that longest generation."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import duration_pb2
from sluice.inference.v1 import inference_pb2 as pb

from shim.tracing import note_usage

#: The access-log line of the request being served, when it is sampled (the admission middleware sets it).
LOG_FIELDS: contextvars.ContextVar[dict[str, object] | None] = contextvars.ContextVar(
    "log_fields", default=None
)


def _ms(duration: duration_pb2.Duration) -> float:
    return round(duration.seconds * 1000.0 + duration.nanos / 1e6, 3)


def request_metrics(
    usage: Mapping[str, Any], timings: Sequence[pb.GenerateTimings], *, model: str
) -> dict[str, float]:
    """The `metrics` object of an answer from `model` whose usage totals are `usage` (prompt_tokens,
    completion_tokens), from its calls' timings; notes both in the access-log line."""
    queue = max((_ms(t.queue_wait) for t in timings), default=0.0)
    first = min((_ms(t.time_to_first_token) for t in timings if t.tokens), default=0.0)
    generation = max((_ms(t.decode) for t in timings), default=0.0)
    gaps = sum(max(t.tokens - 1, 0) for t in timings)
    completion = int(usage.get("completion_tokens", 0))
    metrics = {
        "queue_time_ms": queue,
        "time_to_first_token_ms": first,
        "generation_time_ms": generation,
        "mean_itl_ms": round(sum(_ms(t.decode) for t in timings) / gaps, 3) if gaps else 0.0,
        "tokens_per_second": round(completion * 1000.0 / generation, 3) if generation else 0.0,
    }
    note_usage(usage, model=model, metrics=metrics)
    fields = LOG_FIELDS.get()
    if fields is not None:
        fields["model"] = model
        fields["prompt_tokens"] = int(usage.get("prompt_tokens", 0))
        fields["completion_tokens"] = completion
        fields["queue_ms"], fields["ttft_ms"], fields["decode_ms"] = queue, first, generation
    return metrics
