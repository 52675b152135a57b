"""POST /v1/embeddings: one Infer call per input text (the server's dynamic batcher batches them by length),
answered as OpenAI's embedding list, each vector as floats or as base64 of its little-endian float32 bytes."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from sluice.inference.v1 import inference_pb2 as pb

from clients.codec import decode_raw_contents, typed_contents
from clients.messages import infer_request
from shim.errors import upstream_protocol_error
from shim.openai.request_models import EmbeddingRequest
from shim.upstream.channel import Upstream

TEXT_INPUT = "text"  # what an embedding model takes: one STRING tensor of shape [1]
EMBEDDING_OUTPUT = "embedding"
TOKENS_OUTPUT = "tokens"  # optional: how many tokens the text had, for usage


def infer_requests(body: EmbeddingRequest, *, priority: Any, request_id: str) -> list[pb.InferRequest]:
    return [
        infer_request(
            body.model,
            [
                pb.Tensor(
                    name=TEXT_INPUT,
                    dtype=pb.DATA_TYPE_STRING,
                    shape=[1],
                    contents=pb.TensorContents(string_contents=[text]),
                )
            ],
            priority=priority,
            request_id=f"{request_id}-{i}",
            parameters=None,
        )
        for i, text in enumerate(body.texts)
    ]


# Calls one request keeps in flight: enough to fill the server's batches (32 by default) twice over, and
# few enough that one request of 2,048 texts never opens more HTTP/2 streams than a server grants a
# connection (streams past its limit are reset, and the caller would get CANCELLED for a valid request).
MAX_CALLS_IN_FLIGHT = 64


async def embed(
    upstream: Upstream,
    requests: list[pb.InferRequest],
    *,
    timeout_s: float,
    metadata: tuple[tuple[str, str], ...],
) -> list[pb.InferResponse]:
    """Every call, at most MAX_CALLS_IN_FLIGHT at a time, within one deadline for the whole request; the
    first failure cancels the rest and raises its AioRpcError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    gate = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)
    calls: list[Any] = []

    async def infer(request: pb.InferRequest) -> pb.InferResponse:
        async with gate:
            call = upstream.inference.Infer(
                request, timeout=max(deadline - loop.time(), 0.001), metadata=metadata
            )
            calls.append(call)
            response: pb.InferResponse = await call
            return response

    tasks = [asyncio.ensure_future(infer(request)) for request in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        for call in calls:
            call.cancel()


def _output(response: pb.InferResponse, name: str) -> np.ndarray[Any, Any] | None:
    for tensor in response.outputs:
        if tensor.name == name:
            if tensor.raw_contents:
                return decode_raw_contents(tensor).ravel()
            return np.asarray(list(typed_contents(tensor)))
    return None


def embedding_list(body: EmbeddingRequest, responses: list[pb.InferResponse]) -> dict[str, Any]:
    data = []
    tokens = 0
    for index, response in enumerate(responses):
        vector = _output(response, EMBEDDING_OUTPUT)
        if vector is None:
            raise upstream_protocol_error(
                f"model {body.model!r} answered without an {EMBEDDING_OUTPUT!r} output"
            )
        counted = _output(response, TOKENS_OUTPUT)
        tokens += int(counted[0]) if counted is not None and counted.size else 0
        values = vector.astype("<f4")
        encoded: Any = (
            base64.b64encode(values.tobytes()).decode() if body.encoding_format == "base64" else values
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return {
        "object": "list",
        "data": data,
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
