"""The gRPC baselines of bench.admission answer Infer as its load generators send it: the plain batcher
(bench.plain_batcher) with the MLP's output for each caller's own input, the no-op (bench.noop_grpc) with
512 float32."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import numpy as np
import torch
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from bench.callers import infer_request_bytes
from server.runtimes.mlp import build_mlp
from tests.support.processes import spawn


@contextmanager
def baseline(module: str, banner: str) -> Iterator[pb_grpc.InferenceServiceStub]:
    """`python -m module --port 0` until its ready banner, a stub on its port, then SIGTERM: exit 0."""
    proc = spawn(module, ["-m", module, "--port", "0", "--torch-threads", "1"])
    try:
        port = proc.wait_for_line(rf"{banner} listening on [^:]+:(\d+)").group(1)
        proc.wait_for_line(rf"{banner} ready")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.InferenceServiceStub(channel)
    finally:
        code = proc.terminate()
    assert code == 0, proc.diagnostics()


def request(x: np.ndarray) -> pb.InferRequest:
    tensor = pb.Tensor(name="x", dtype=pb.DATA_TYPE_FLOAT32, shape=[512], raw_contents=x.tobytes())
    return pb.InferRequest(model="mlp", inputs=[tensor])


def output(response: pb.InferResponse) -> np.ndarray:
    (tensor,) = response.outputs
    assert (tensor.name, tensor.dtype, list(tensor.shape)) == ("y", pb.DATA_TYPE_FLOAT32, [512])
    return np.frombuffer(tensor.raw_contents, dtype=np.float32)


def test_plain_batcher_answers_each_caller_with_the_mlp_of_its_input() -> None:
    net = build_mlp(2048)
    xs = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    with torch.inference_mode():
        expected = [net(torch.from_numpy(x[None])).numpy()[0] for x in xs]
    with baseline("bench.plain_batcher", "plain batcher") as stub:
        one = output(stub.Infer(request(xs[0]), timeout=30.0))
        # Concurrent calls share batches: each must still get the row of its own input.
        calls = [stub.Infer.future(request(x), timeout=30.0) for x in xs]
        outputs = [output(call.result()) for call in calls]
    np.testing.assert_allclose(one, expected[0], rtol=0, atol=1e-5)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_noop_answers_the_load_generators_request_with_512_float32() -> None:
    with baseline("bench.noop_grpc", "noop grpc") as stub:
        response = stub.Infer(pb.InferRequest.FromString(infer_request_bytes()), timeout=30.0)
    assert len(output(response)) == 512
