"""One measured point of streamed generation: S concurrent streams, each a fixed-length chat completion
(min_tokens = max_tokens, ignore_eos), over gRPC Generate or through the shim's OpenAI chat SSE route.

Driven by h2load (C: one HTTP/2 connection of S gRPC streams, or S HTTP/1.1 connections of SSE) or by
Python (grpc.aio streams, or httpx reading SSE lines), closed loop: a finished stream starts the next.
Tokens/s is the server's own count of sampled tokens over the window (`sluice_tokens_generated_total`),
the same measure on both paths; CPU is sampled from the service processes at the window's edges.
"""

from __future__ import annotations

import asyncio
import json
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.h2load_point import h2load_path
from bench.points import Window, cpu_seconds
from bench.processes import ChildProcess
from bench.prometheus import scrape, total

MODEL = "byte-lm"
PROMPT = "Write one sentence about rivers."
GENERATE_METHOD = "/sluice.inference.v1.InferenceService/Generate"


@dataclass(frozen=True, slots=True)
class StreamPoint:
    tokens_per_s: float
    streams_done: int  # streams that ended inside the window (h2load: all it finished)
    service_cores: dict[str, float]  # CPU seconds per second, by process role
    service_cpu_s: dict[str, float]  # CPU seconds in the window, by process role


def grpc_request(tokens: int) -> pb.GenerateRequest:
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content=PROMPT)])
    sampling = pb.SamplingParams(
        max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=1.0, seed=7
    )
    return pb.GenerateRequest(model=MODEL, chat=chat, sampling=sampling)


def chat_body(tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "min_tokens": tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": 7,
            "stream": True,
        }
    ).encode()


def _h2load_command(path: str, target: str, streams: int, window: Window, body: Path) -> list[str]:
    h2load = h2load_path()
    if h2load is None:
        raise RuntimeError("h2load is not installed (Debian package nghttp2-client)")
    total_ms = round((window.warmup_s + window.duration_s) * 1000) + 2000  # ends after the window
    if path == "grpc":
        shape = ["-c", "1", "-m", str(streams)]
        headers = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        url = f"http://{target}{GENERATE_METHOD}"
    else:
        shape = ["--h1", "-c", str(streams), "-m", "1"]
        headers = ["-H", "content-type: application/json"]
        url = f"http://{target}/v1/chat/completions"
    return [h2load, *shape, "-D", f"{total_ms}ms", "-d", str(body), *headers, url]


async def _python_streams(path: str, target: str, streams: int, tokens: int, stop_at: float) -> int:
    """Closed-loop streams until `stop_at` (monotonic); returns how many finished."""
    done = 0
    if path == "grpc":
        request = grpc_request(tokens)
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)

            async def one_grpc() -> None:
                nonlocal done
                while time.monotonic() < stop_at:
                    async for _ in stub.Generate(request, timeout=120):
                        pass
                    done += 1

            await asyncio.gather(*(one_grpc() for _ in range(streams)))
        return done
    body = chat_body(tokens)
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(base_url=f"http://{target}", limits=limits, timeout=120) as client:

        async def one_sse() -> None:
            nonlocal done
            headers = {"content-type": "application/json"}
            while time.monotonic() < stop_at:
                async with client.stream("POST", "/v1/chat/completions", content=body, headers=headers) as r:
                    async for line in r.aiter_lines():
                        if line == "data: [DONE]":
                            done += 1

        await asyncio.gather(*(one_sse() for _ in range(streams)))
    return done


def measure_stream_point(
    *,
    generator: str,
    path: str,
    target: str,
    pids: dict[str, list[int]],
    metrics_port: int,
    streams: int,
    tokens: int,
    window: Window,
) -> StreamPoint:
    """generator: h2load | python; path: grpc (the server's target) | sse (the shim's host:port)."""

    def sample() -> tuple[float, float, dict[str, float]]:
        counted = total(scrape(metrics_port), "sluice_tokens_generated_total", model=MODEL)
        return time.monotonic(), counted, {role: cpu_seconds(p) for role, p in pids.items()}

    def point(
        start: tuple[float, float, dict[str, float]], end: tuple[float, float, dict[str, float]], done: int
    ) -> StreamPoint:
        wall = end[0] - start[0]
        cpu = {role: end[2][role] - start[2][role] for role in pids}
        return StreamPoint((end[1] - start[1]) / wall, done, {r: c / wall for r, c in cpu.items()}, cpu)

    if generator == "python":

        async def windowed() -> StreamPoint:
            loop_ends = time.monotonic() + window.warmup_s + window.duration_s
            task = asyncio.create_task(_python_streams(path, target, streams, tokens, loop_ends))
            await asyncio.sleep(window.warmup_s)
            start = sample()
            await asyncio.sleep(window.duration_s)
            end = sample()
            return point(start, end, await task)

        return asyncio.run(windowed())
    with tempfile.TemporaryDirectory(prefix="sluice-stream-") as tmp:
        body = Path(tmp) / "body"
        if path == "grpc":
            message = grpc_request(tokens).SerializeToString()
            body.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
        else:
            body.write_bytes(chat_body(tokens))
        with ChildProcess("h2load", _h2load_command(path, target, streams, window, body)) as client:
            client.wait_for(r"Main benchmark duration is started", 60.0)
            time.sleep(window.warmup_s)
            start = sample()
            time.sleep(window.duration_s)
            end = sample()
            summary = client.wait_for(r"^requests: .* (\d+) succeeded", 120.0)
            client.proc.wait(30.0)
    return point(start, end, int(summary.group(1)))
