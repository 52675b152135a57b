"""The asyncio client: `AsyncSluiceClient` and the `AsyncGenerationStream` its `generate` returns.

The same API as `clients.sync`, awaited; request building, decoding and error mapping are shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import grpc
from grpc import aio
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients.base import ClientBase, Prompt
from clients.channel import ChannelSettings, open_aio_channel
from clients.codec import InputValue
from clients.errors import typed_errors
from clients.messages import (
    chunk_from_response,
    model_info_from_proto,
    result_from_response,
)
from clients.types import GenerationChunk, InferResult, ModelInfo, ParameterScalar, PriorityName
from wire.sampling import Sampling

__all__ = ["AsyncGenerationStream", "AsyncSluiceClient"]


class AsyncGenerationStream:
    """An async iterator over the chunks of one Generate call; cancel() or aclose() ends it early.

    Iteration after `cancel()` simply stops; any other failure raises the typed `SluiceError`.
    """

    def __init__(self, call: aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]) -> None:
        self._call = call
        self._cancelled = False

    def __aiter__(self) -> AsyncGenerationStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        try:
            with typed_errors():
                response = await self._call.read()
        except asyncio.CancelledError:
            # grpc.aio reports a locally cancelled call as CancelledError; that one ends the iteration,
            # while a cancellation of the awaiting task itself must propagate.
            task = asyncio.current_task()
            if self._cancelled and (task is None or task.cancelling() == 0):
                raise StopAsyncIteration from None
            raise
        if not isinstance(response, pb.GenerateResponse):  # aio.EOF: the server finished the stream
            raise StopAsyncIteration
        return chunk_from_response(response)

    def cancel(self) -> None:
        """Cancel the call; the server sees the cancellation and frees the sequence's slot."""
        self._cancelled = True
        self._call.cancel()

    async def aclose(self) -> None:
        """Release the call; cancels it if it has not finished."""
        self.cancel()

    async def __aenter__(self) -> AsyncGenerationStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncSluiceClient(ClientBase):
    """An asyncio client of one Sluice server; create and use it on one event loop.

    Takes ClientBase's arguments (target, timeout, settings, credentials, token).
    """

    def _open(
        self, target: str, settings: ChannelSettings, credentials: grpc.ChannelCredentials | None
    ) -> None:
        self._channel = open_aio_channel(target, settings, credentials)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, InputValue],
        *,
        priority: PriorityName | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, ParameterScalar] | None = None,
        # ASYNC109 prefers asyncio.timeout, but only a gRPC deadline reaches the server and stops its work.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> InferResult:
        """Run one item through a tensor model and return its decoded outputs."""
        request = self._infer_request(
            model, inputs, priority=priority, request_id=request_id, parameters=parameters
        )
        with typed_errors():
            response = await self._stub.Infer(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        return result_from_response(response)

    def generate(
        self,
        model: str,
        prompt: Prompt,
        *,
        sampling: Sampling | None = None,
        priority: PriorityName | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> AsyncGenerationStream:
        """Start a generation; sampling settings as `sampling=Sampling(...)` or its fields by keyword
        (`max_tokens=16, temperature=0`); `async for` over the returned stream (errors surface while
        iterating)."""
        request = self._generate_request(model, prompt, sampling, fields, priority, request_id)
        return AsyncGenerationStream(
            self._stub.Generate(request, timeout=self._deadline(timeout), metadata=self._metadata)
        )

    async def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:  # noqa: ASYNC109
        """Every model the server has loaded, sorted by name."""
        with typed_errors():
            response = await self._stub.ListModels(
                pb.ListModelsRequest(), timeout=self._deadline(timeout), metadata=self._metadata
            )
        return [model_info_from_proto(info) for info in response.models]

    async def get_model(self, name: str, *, timeout: float | None = None) -> ModelInfo:  # noqa: ASYNC109
        """The metadata of one model; raises NotFoundError for an unknown name."""
        with typed_errors():
            response = await self._stub.GetModel(
                pb.GetModelRequest(name=name), timeout=self._deadline(timeout), metadata=self._metadata
            )
        return model_info_from_proto(response.model)

    async def load_lora_adapter(
        self,
        name: str,
        path: str,
        *,
        base_model: str = "",
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> ModelInfo:
        """Loads the LoRA adapter (a PEFT directory on the server) as model `name`; its metadata. Needs an
        admin token where the server has a keys file."""
        request = pb.LoadLoraAdapterRequest(lora_name=name, lora_path=path, base_model_name=base_model)
        with typed_errors():
            response = await self._stub.LoadLoraAdapter(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        return model_info_from_proto(response.model)

    async def unload_lora_adapter(self, name: str, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Stops serving adapter `name`; raises NotFoundError where none is loaded by that name."""
        with typed_errors():
            await self._stub.UnloadLoraAdapter(
                pb.UnloadLoraAdapterRequest(lora_name=name),
                timeout=self._deadline(timeout),
                metadata=self._metadata,
            )

    async def close(self) -> None:
        """Close the channel; calls still in flight are cancelled."""
        await self._channel.close(grace=None)

    async def __aenter__(self) -> AsyncSluiceClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
