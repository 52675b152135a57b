"""The HTTP stack's limit: a bare uvicorn endpoint that does no work, on the same stack the shim runs
(uvicorn, uvloop, httptools, one process), for the gateway benchmark to divide by.

    python -m bench.noop_http --port 0

Every POST has its body read in full and gets the same fixed JSON answer, sized like the shim's answer to
the benchmark's Infer (an outputs list of 10 float32); nothing is parsed. Prints
`noop http listening on 127.0.0.1:PORT` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import uvicorn
import uvloop

from shim.serving import bind_socket

ANSWER = json.dumps(
    {
        "model": "mlp",
        "outputs": [{"name": "y", "dtype": "FLOAT32", "shape": [10], "data": [0.123456] * 10}],
        "request_id": "0" * 32,
    }
).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


class _Announcing(uvicorn.Server):
    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        host, port = sockets[0].getsockname()[:2]
        print(f"noop http listening on {host}:{port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_http", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sock = bind_socket("127.0.0.1", args.port)
    config = uvicorn.Config(app, http="httptools", log_config=None, access_log=False, log_level="warning")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_Announcing(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
