"""The gRPC framework's limit: a bare grpc.aio server whose Infer does no work, for bench.admission to
divide by.

    python -m bench.noop_grpc --port 0

Infer answers one InferResponse built at start-up, shaped like the MLP's (`y`, 512 float32 zeros in
raw_contents), without touching torch. The generated servicer still parses each request and serializes the
answer, as every servicer does: 0.7 µs together (upb), next to grpc.aio's own 100+ µs per call.
Prints `noop grpc listening on HOST:PORT` and then `noop grpc ready`; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

FEATURES = 512
ANSWER = pb.InferResponse(
    model="mlp",
    model_version="1",
    outputs=[
        pb.Tensor(name="y", dtype=pb.DATA_TYPE_FLOAT32, shape=[FEATURES], raw_contents=bytes(4 * FEATURES))
    ],
)


class NoopInference(pb_grpc.InferenceServiceServicer):
    async def Infer(
        self, request: pb.InferRequest, context: grpc.aio.ServicerContext[pb.InferRequest, pb.InferResponse]
    ) -> pb.InferResponse:
        return ANSWER


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server()
    service = NoopInference()  # type: ignore[abstract]  # the generated base answers UNIMPLEMENTED
    pb_grpc.add_InferenceServiceServicer_to_server(service, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"noop grpc listening on {host}:{bound}", flush=True)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    print("noop grpc ready", flush=True)
    await stopping.wait()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_grpc", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=0, help="accepted for a common command line")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
