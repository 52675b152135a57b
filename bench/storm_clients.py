"""The client kinds of the storms: gRPC and SSE readers that may leave after some tokens, raw-socket SSE
readers that trickle (or never read), and gRPC callers that stop reading mid-stream."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass

import grpc
import httpx
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.storm_server import MODEL
from clients.errors import status_details_of

CALL_TIMEOUT_S = 120.0
# A caller that stops reading entirely: a small receive window so that its few buffered messages fill it.
STALLED_CHANNEL_OPTIONS = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


@dataclass
class Caller:
    """What one stream's client saw: tokens received, and the server's count if it reached the end."""

    received: int = 0
    completion_tokens: int | None = None
    first_token_s: float | None = None
    finished_s: float | None = None


async def grpc_caller(
    stub: pb_grpc.InferenceServiceStub, prompt: str, *, max_tokens: int, leave_after: int | None
) -> Caller:
    """Reads a Generate stream; with leave_after, cancels the call once that many tokens arrived."""
    seen = Caller()
    request = pb.GenerateRequest(
        model=MODEL, text=prompt, sampling=pb.SamplingParams(max_tokens=max_tokens, seed=len(prompt))
    )
    call = stub.Generate(request, timeout=CALL_TIMEOUT_S)
    try:
        async for message in call:
            seen.received += len(message.token_ids)
            if message.finish_reason:
                seen.completion_tokens = message.usage.completion_tokens
            elif leave_after is not None and seen.received >= leave_after:
                break
    finally:
        call.cancel()
    return seen


async def sse_caller(
    http: httpx.AsyncClient, prompt: str, *, max_tokens: int, leave_after: int | None
) -> Caller:
    """Reads /v1/generate as SSE; with leave_after, closes the connection once that many tokens arrived."""
    seen = Caller()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "seed": len(prompt), "stream": True}
    started = time.perf_counter()
    async with http.stream("POST", "/v1/generate", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = json.loads(line[5:])
            if "usage" in data:
                seen.completion_tokens = data["usage"]["completion_tokens"]
                seen.finished_s = time.perf_counter() - started
                break
            seen.received += len(data.get("token_ids", ()))
            if seen.first_token_s is None:
                seen.first_token_s = time.perf_counter() - started
            if leave_after is not None and seen.received >= leave_after:
                break  # leaving the block closes the connection mid-stream
    return seen


def sse_request(port: int, prompt: str, max_tokens: int) -> bytes:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    head = (
        f"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def trickle_reader(
    port: int,
    prompt: str,
    *,
    max_tokens: int,
    bytes_per_s: float,
    duration_s: float,
    read: list[int],
    rcvbuf: int = 2048,
) -> None:
    """A raw-socket SSE client with a small receive buffer that reads ~bytes_per_s (0: never reads)
    for duration_s or until cancelled, then closes; appends the size of each read to `read`."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, sse_request(port, prompt, max_tokens))
        end = time.monotonic() + duration_s
        while (left := end - time.monotonic()) > 0:
            if bytes_per_s <= 0:
                await asyncio.sleep(left)
                break
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 100), timeout=left)
            except TimeoutError:
                break
            if not data:
                break
            read.append(len(data))
            await asyncio.sleep(len(data) / bytes_per_s)
    finally:
        sock.close()


async def stalled_grpc_caller(channel: grpc.aio.Channel, prompt: str, ended: asyncio.Event) -> str:
    """Reads one message, then nothing until `ended`; then drains and returns the final error reason."""
    stub = pb_grpc.InferenceServiceStub(channel)
    request = pb.GenerateRequest(model=MODEL, text=prompt, sampling=pb.SamplingParams(max_tokens=200))
    call = stub.Generate(request, timeout=CALL_TIMEOUT_S)
    try:
        await call.read()
        await ended.wait()
        while isinstance(message := await call.read(), pb.GenerateResponse):
            if message.finish_reason:
                return message.error.reason or pb.FinishReason.Name(message.finish_reason)
        return "no final message"
    except grpc.aio.AioRpcError as error:
        # The server's watchdog ended the unwritable call first (after twice the stall timeout): the status
        # says why, as the final message would have.
        return status_details_of(error).reason or error.code().name
    finally:
        call.cancel()
