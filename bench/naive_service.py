"""The common-recipe baseline: FastAPI + uvicorn, JSON in and out, one item per forward pass.

    python -m bench.naive_service --port 0 --torch-threads 2

asyncio.Semaphore(2) bounds concurrent forward passes, each run with loop.run_in_executor on the default
executor; a request that would be the 51st waiting is answered 503 at once. Prints
`naive service listening on HOST:PORT` and then `naive service ready`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from server.runtimes.mlp import build_mlp

FEATURES = 512


class InferBody(BaseModel):
    x: list[float] = Field(min_length=FEATURES, max_length=FEATURES)


def create_app(net: torch.nn.Module, *, concurrency: int, max_waiting: int) -> FastAPI:
    app = FastAPI()
    semaphore = asyncio.Semaphore(concurrency)
    waiting = 0

    def forward(x: list[float]) -> list[float]:
        with torch.inference_mode():
            out: list[float] = net(torch.tensor(x).unsqueeze(0))[0].tolist()
            return out

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/infer", response_model=None)
    async def infer(body: InferBody) -> dict[str, list[float]] | JSONResponse:
        nonlocal waiting
        if semaphore.locked() and waiting >= max_waiting:
            return JSONResponse({"detail": "overloaded"}, status_code=503)
        waiting += 1
        try:
            await semaphore.acquire()
        finally:
            waiting -= 1
        try:
            y = await asyncio.get_running_loop().run_in_executor(None, forward, body.x)
        finally:
            semaphore.release()
        return {"y": y}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.naive_service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=0)
    parser.add_argument("--mlp-width", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-waiting", type=int, default=50)
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    net = build_mlp(args.mlp_width)
    with torch.inference_mode():
        net(torch.zeros(1, FEATURES))  # first-call initialisation off the request path
    app = create_app(net, concurrency=args.concurrency, max_waiting=args.max_waiting)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)  # connections made before uvicorn starts wait in the backlog
    host, port = sock.getsockname()[:2]
    print(f"naive service listening on {host}:{port}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, backlog=2048)
    server = uvicorn.Server(config)
    print("naive service ready", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
