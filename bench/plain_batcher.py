"""The afternoon baseline: a grpc.aio Infer server with the common dynamic-batching recipe and nothing else.

    python -m bench.plain_batcher --port 0 --torch-threads 1

Each call decodes its input with numpy.frombuffer and puts it, with a future, on an unbounded asyncio.Queue.
One batching task waits for the first item, takes what else is queued, and waits up to --window-ms (1) for
more while the batch is short of --max-batch-size (32); the batch runs on one executor thread, eager torch
under inference_mode (the MLP of server.runtimes.mlp, not traced as Sluice runs it), and each future gets its
row. No admission control, deadlines, metrics or timings. Prints `plain batcher listening on HOST:PORT` and
then `plain batcher ready`; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import torch
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from server.runtimes.mlp import build_mlp

FEATURES = 512
Pending = tuple[np.ndarray, "asyncio.Future[np.ndarray]"]


async def next_batch(queue: asyncio.Queue[Pending], *, max_batch: int, window_s: float) -> list[Pending]:
    """The first item to arrive, then what else comes within window_s of it, up to max_batch."""
    items = [await queue.get()]
    deadline = asyncio.get_running_loop().time() + window_s
    while len(items) < max_batch:
        if not queue.empty():
            items.append(queue.get_nowait())
            continue
        try:
            async with asyncio.timeout_at(deadline):
                items.append(await queue.get())
        except TimeoutError:
            break
    return items


async def run_batches(queue: asyncio.Queue[Pending], net: torch.nn.Module, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")

    def forward(xs: list[np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out: np.ndarray = net(torch.from_numpy(np.stack(xs))).numpy()
            return out

    while True:
        batch = await next_batch(queue, max_batch=args.max_batch_size, window_s=args.window_ms / 1000)
        try:
            ys = await loop.run_in_executor(executor, forward, [x for x, _ in batch])
        except Exception as exc:  # one bad batch fails its callers, not the loop
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            continue
        for (_, future), y in zip(batch, ys, strict=True):
            if not future.done():  # the caller may have gone
                future.set_result(y)


class PlainInference(pb_grpc.InferenceServiceServicer):
    def __init__(self, queue: asyncio.Queue[Pending]) -> None:
        self.queue = queue

    async def Infer(
        self, request: pb.InferRequest, context: grpc.aio.ServicerContext[pb.InferRequest, pb.InferResponse]
    ) -> pb.InferResponse:
        raw = request.inputs[0].raw_contents if request.inputs else b""
        if len(raw) != 4 * FEATURES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"expected {FEATURES} float32 in x")
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((np.frombuffer(raw, dtype=np.float32), future))
        y = await future
        tensor = pb.Tensor(name="y", dtype=pb.DATA_TYPE_FLOAT32, shape=[FEATURES], raw_contents=y.tobytes())
        return pb.InferResponse(model="mlp", model_version="1", outputs=[tensor])


async def serve(args: argparse.Namespace) -> None:
    net = build_mlp(args.mlp_width)
    with torch.inference_mode():
        net(torch.zeros(1, FEATURES))  # first-call initialisation off the request path
    queue: asyncio.Queue[Pending] = asyncio.Queue()
    server = grpc.aio.server()
    service = PlainInference(queue)  # type: ignore[abstract]  # the generated base answers UNIMPLEMENTED
    pb_grpc.add_InferenceServiceServicer_to_server(service, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    print(f"plain batcher listening on {args.host}:{port}", flush=True)
    batcher = asyncio.create_task(run_batches(queue, net, args))
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    print("plain batcher ready", flush=True)
    await stopping.wait()
    await server.stop(1.0)
    batcher.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plain_batcher", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--mlp-width", type=int, default=2048)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--window-ms", type=float, default=1.0, help="how long a short batch waits for more")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
