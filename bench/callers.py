"""One call of each protocol under test, built once per client process with its request pre-serialized.

Each factory returns an Endpoint; the per-call path does no protobuf or JSON work:
gRPC sends the serialized InferRequest as raw bytes, HTTP posts a pre-encoded JSON body.
"""

from __future__ import annotations

import asyncio
import enum
import json
import random
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import httpx
from sluice.inference.v1 import inference_pb2 as pb

INFER_METHOD = "/sluice.inference.v1.InferenceService/Infer"
FEATURES = 512
_REFUSED_GRPC = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


class Outcome(enum.Enum):
    OK = "ok"
    REFUSED = "refused"  # RESOURCE_EXHAUSTED / UNAVAILABLE (gRPC), 503 (HTTP)
    ERROR = "error"  # anything else: deadline, transport, 4xx/5xx


@dataclass(slots=True)
class CallResult:
    outcome: Outcome
    detail: str = ""  # status code name for errors, empty otherwise
    body: bytes = b""  # the response, kept only when asked for (for sampling batch sizes)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """`call(keep_body)` makes one request; `ready()` connects before the window; `close()` at the end."""

    call: Callable[[bool], Awaitable[CallResult]]
    ready: Callable[[], Awaitable[None]]
    close: Callable[[], Awaitable[None]]


def input_vector(seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0.0, 1.0) for _ in range(FEATURES)]


def infer_request_bytes() -> bytes:
    raw = struct.pack(f"<{FEATURES}f", *input_vector())
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[FEATURES], raw_contents=raw)
    return pb.InferRequest(model="mlp", inputs=[tensor]).SerializeToString()


def http_request(api: str) -> tuple[str, bytes]:
    """(path, JSON body) of one Infer call: the naive service's `{"x": [...]}` or Sluice's native API
    through the shim (the same 512 floats as a JSON list)."""
    if api == "naive":
        return "/infer", json.dumps({"x": input_vector()}).encode()
    if api == "sluice":
        tensor = {"name": "x", "dtype": "FLOAT32", "shape": [FEATURES], "data": input_vector()}
        return "/v1/infer", json.dumps({"model": "mlp", "inputs": [tensor]}).encode()
    raise ValueError(f"unknown HTTP API {api!r}: naive or sluice")


def grpc_infer(target: str, *, timeout_s: float) -> Endpoint:
    channel = grpc.aio.insecure_channel(target)
    infer = channel.unary_unary(INFER_METHOD, request_serializer=None, response_deserializer=None)
    request = infer_request_bytes()

    async def call(keep_body: bool) -> CallResult:
        try:
            body = await infer(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            outcome = Outcome.REFUSED if code in _REFUSED_GRPC else Outcome.ERROR
            return CallResult(outcome, code.name)
        return CallResult(Outcome.OK, body=body if keep_body else b"")

    async def ready() -> None:
        await asyncio.wait_for(channel.channel_ready(), 30.0)

    async def close() -> None:
        await channel.close(grace=None)

    return Endpoint(call, ready, close)


def http_infer(base_url: str, *, timeout_s: float, connections: int, api: str = "naive") -> Endpoint:
    client = httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout_s,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
    path, body = http_request(api)
    headers = {"content-type": "application/json"}

    async def call(keep_body: bool) -> CallResult:
        try:
            response = await client.post(path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return CallResult(Outcome.ERROR, type(exc).__name__)
        if response.status_code == 503:
            return CallResult(Outcome.REFUSED)
        if not response.is_success:
            return CallResult(Outcome.ERROR, f"HTTP {response.status_code}")
        return CallResult(Outcome.OK)

    async def ready() -> None:
        (await client.get("/healthz", timeout=30.0)).raise_for_status()

    async def close() -> None:
        await client.aclose()

    return Endpoint(call, ready, close)


def raw_http_infer(host: str, port: int, *, timeout_s: float, api: str = "naive") -> Endpoint:
    """HTTP/1.1 keep-alive over asyncio streams with a pre-built request: a load generator that costs a
    fraction of httpx per call (measured in the `client cores` column), leaving the cores to the service."""
    path, body = http_request(api)
    request = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bool]:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        await reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers.get("connection") != "close"

    async def call(keep_body: bool) -> CallResult:
        conn = idle.pop() if idle else None
        try:
            async with asyncio.timeout(timeout_s):
                if conn is None:
                    conn = await asyncio.open_connection(host, port)
                status, reusable = await exchange(*conn)
        except (
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ValueError,
        ) as exc:
            if conn is not None:
                conn[1].close()
            return CallResult(Outcome.ERROR, type(exc).__name__)
        if reusable:
            idle.append(conn)
        else:
            conn[1].close()
        if status == 503:
            return CallResult(Outcome.REFUSED)
        if not 200 <= status < 300:
            return CallResult(Outcome.ERROR, f"HTTP {status}")
        return CallResult(Outcome.OK)

    async def ready() -> None:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30.0)
        writer.write(f"GET /healthz HTTP/1.1\r\nhost: {host}:{port}\r\n\r\n".encode())
        status_line = await asyncio.wait_for(reader.readline(), 30.0)
        writer.close()
        if b" 200 " not in status_line:
            raise RuntimeError(f"health check answered {status_line!r}")

    async def close() -> None:
        while idle:
            idle.pop()[1].close()

    return Endpoint(call, ready, close)


def batch_timings(bodies: list[bytes]) -> list[tuple[int, float, float]]:
    """Decodes sampled InferResponses after the window: (batch size, compute ms, queue-wait ms) each; answers
    without timings (the baselines send none) are left out."""
    out = []
    for body in bodies:
        response = pb.InferResponse.FromString(body)
        if not response.HasField("timings"):
            continue
        timings = response.timings
        compute_ms = timings.compute.ToNanoseconds() / 1e6
        out.append((timings.batch_size, compute_ms, timings.queue_wait.ToNanoseconds() / 1e6))
    return out
