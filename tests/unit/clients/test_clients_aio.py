"""AsyncSluiceClient over the wire against the scripted in-process server.

Each test drives its coroutine with asyncio.run, so no async pytest plugin is needed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
from sluice.inference.v1 import inference_pb2 as pb

from clients import (
    AsyncSluiceClient,
    DeadlineExceededError,
    GenerationChunk,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
    Usage,
)

if TYPE_CHECKING:  # the fixture's type only; tests never import conftest at run time
    from tests.unit.clients.conftest import FakeServer


def test_infer_round_trips_tensors(fake_server: FakeServer) -> None:
    async def main() -> None:
        async with AsyncSluiceClient(fake_server.target, timeout=10.0) as client:
            x = np.linspace(0, 1, 6, dtype=np.float64).reshape(3, 2)
            result = await client.infer("double", {"x": x, "flag": np.array([True, False])}, priority="low")
        np.testing.assert_array_equal(result.outputs["x"], x * 2)
        np.testing.assert_array_equal(result.outputs["flag"], [False, True])
        assert (result.queue_wait_s, result.compute_s, result.batch_size) == (0.25, 1.5, 3)

    asyncio.run(main())
    assert fake_server.service.infer_requests[-1].priority == pb.PRIORITY_LOW


def test_errors_are_typed(fake_server: FakeServer) -> None:
    async def main() -> None:
        async with AsyncSluiceClient(fake_server.target) as client:
            with pytest.raises(ResourceExhaustedError) as overloaded:
                await client.infer("overloaded", {"x": np.zeros(1, np.float32)})
            with pytest.raises(NotFoundError) as missing:
                await client.get_model("missing")
        assert overloaded.value.retry_after == 1.5
        assert overloaded.value.reason == "QUEUE_FULL"
        assert missing.value.metadata == {"model": "missing"}
        assert isinstance(missing.value.__cause__, grpc.aio.AioRpcError)

    asyncio.run(main())


def test_unary_retried_generate_not(fake_server: FakeServer) -> None:
    async def main() -> None:
        async with AsyncSluiceClient(fake_server.target) as client:
            await client.infer("flaky", {"x": np.ones(1, np.float32)})
            with pytest.raises(UnavailableError):
                async for _ in client.generate("unavailable", "x"):
                    pass

    asyncio.run(main())
    assert fake_server.service.infer_attempts["flaky"] == 3
    assert fake_server.service.generate_attempts["unavailable"] == 1


def test_generate_streams_chunks(fake_server: FakeServer) -> None:
    async def main() -> list[GenerationChunk]:
        async with AsyncSluiceClient(fake_server.target) as client:
            return [chunk async for chunk in client.generate("echo", "a b c", temperature=0.0, top_k=5)]

    chunks = asyncio.run(main())
    assert "".join(c.text for c in chunks) == "a b c "
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage == Usage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    sampling = fake_server.service.generate_requests[-1].sampling
    assert sampling.HasField("temperature")
    assert sampling.temperature == 0.0
    assert sampling.top_k == 5


def test_cancel_ends_iteration_and_reaches_server(fake_server: FakeServer) -> None:
    async def main() -> list[str]:
        async with AsyncSluiceClient(fake_server.target) as client:
            stream = client.generate("endless", "x")
            texts = [(await anext(stream)).text]
            stream.cancel()
            texts += [chunk.text async for chunk in stream]
            return texts

    assert asyncio.run(main()) == ["tick"]
    assert fake_server.service.stream_cancelled.wait(timeout=10)


def test_leaving_async_with_cancels_the_call(fake_server: FakeServer) -> None:
    async def main() -> None:
        async with (
            AsyncSluiceClient(fake_server.target) as client,
            client.generate("endless", "x") as stream,
        ):
            assert (await anext(stream)).text == "tick"

    asyncio.run(main())
    assert fake_server.service.stream_cancelled.wait(timeout=10)


def test_task_cancellation_propagates(fake_server: FakeServer) -> None:
    """Only a stream cancelled through cancel() ends quietly; cancelling the consuming task must not."""

    async def main() -> None:
        async with AsyncSluiceClient(fake_server.target) as client:
            stream = client.generate("endless", "x")

            async def consume() -> None:
                async for _ in stream:
                    pass

            task = asyncio.create_task(consume())
            started = await asyncio.to_thread(fake_server.service.stream_started.wait, 10)
            assert started
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert fake_server.service.stream_cancelled.wait(timeout=10)


def test_deadline_raises_deadline_exceeded(fake_server: FakeServer) -> None:
    async def main() -> None:
        async with AsyncSluiceClient(fake_server.target, timeout=0.2) as client:
            with pytest.raises(DeadlineExceededError):
                async for _ in client.generate("endless", "x"):
                    pass

    asyncio.run(main())


def test_list_models(fake_server: FakeServer) -> None:
    async def main() -> None:
        async with AsyncSluiceClient(fake_server.target) as client:
            models = await client.list_models()
        assert [(m.name, m.kind, m.max_batch_size) for m in models] == [
            ("double", "tensor", 32),
            ("echo", "generative", 8),
        ]

    asyncio.run(main())
