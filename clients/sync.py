"""The blocking client: `SluiceClient` and the `GenerationStream` its `generate` returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients.base import ClientBase, Prompt
from clients.channel import ChannelSettings, open_channel
from clients.codec import InputValue
from clients.errors import error_from_rpc, typed_errors
from clients.messages import (
    chunk_from_response,
    model_info_from_proto,
    result_from_response,
)
from clients.types import GenerationChunk, InferResult, ModelInfo, ParameterScalar, PriorityName
from wire.sampling import Sampling

__all__ = ["GenerationStream", "SluiceClient"]


class GenerationStream:
    """An iterator over the chunks of one Generate call; cancel() or close() ends the call early.

    Iteration after `cancel()` simply stops; any other failure raises the typed `SluiceError`.
    """

    def __init__(self, call: grpc.CallIterator[pb.GenerateResponse]) -> None:
        self._call = call
        self._responses = iter(call)
        self._cancelled = False

    def __iter__(self) -> Iterator[GenerationChunk]:
        return self

    def __next__(self) -> GenerationChunk:
        try:
            response = next(self._responses)
        except grpc.RpcError as exc:
            if self._cancelled and exc.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise error_from_rpc(exc) from exc
        return chunk_from_response(response)

    def cancel(self) -> None:
        """Cancel the call; the server sees the cancellation and frees the sequence's slot."""
        self._cancelled = True
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel untyped

    def close(self) -> None:
        """Release the call; cancels it if it has not finished."""
        self.cancel()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SluiceClient(ClientBase):
    """A blocking client of one Sluice server; safe to share between threads.

    Takes ClientBase's arguments (target, timeout, settings, credentials, token).
    """

    def _open(
        self, target: str, settings: ChannelSettings, credentials: grpc.ChannelCredentials | None
    ) -> None:
        self._channel = open_channel(target, settings, credentials)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, InputValue],
        *,
        priority: PriorityName | None = None,
        request_id: str | None = None,
        parameters: Mapping[str, ParameterScalar] | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        """Run one item through a tensor model and return its decoded outputs."""
        request = self._infer_request(
            model, inputs, priority=priority, request_id=request_id, parameters=parameters
        )
        with typed_errors():
            response = self._stub.Infer(request, timeout=self._deadline(timeout), metadata=self._metadata)
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
    ) -> GenerationStream:
        """Start a generation; sampling settings as `sampling=Sampling(...)` or its fields by keyword
        (`max_tokens=16, temperature=0`); iterate the returned stream for its chunks (errors surface while
        iterating)."""
        request = self._generate_request(model, prompt, sampling, fields, priority, request_id)
        return GenerationStream(
            self._stub.Generate(request, timeout=self._deadline(timeout), metadata=self._metadata)
        )

    def list_models(self, *, timeout: float | None = None) -> list[ModelInfo]:
        """Every model the server has loaded, sorted by name."""
        with typed_errors():
            response = self._stub.ListModels(
                pb.ListModelsRequest(), timeout=self._deadline(timeout), metadata=self._metadata
            )
        return [model_info_from_proto(info) for info in response.models]

    def get_model(self, name: str, *, timeout: float | None = None) -> ModelInfo:
        """The metadata of one model; raises NotFoundError for an unknown name."""
        with typed_errors():
            response = self._stub.GetModel(
                pb.GetModelRequest(name=name), timeout=self._deadline(timeout), metadata=self._metadata
            )
        return model_info_from_proto(response.model)

    def load_lora_adapter(
        self, name: str, path: str, *, base_model: str = "", timeout: float | None = None
    ) -> ModelInfo:
        """Loads the LoRA adapter (a PEFT directory on the server) as model `name`; its metadata. Needs an
        admin token where the server has a keys file."""
        request = pb.LoadLoraAdapterRequest(lora_name=name, lora_path=path, base_model_name=base_model)
        with typed_errors():
            response = self._stub.LoadLoraAdapter(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        return model_info_from_proto(response.model)

    def unload_lora_adapter(self, name: str, *, timeout: float | None = None) -> None:
        """Stops serving adapter `name`; raises NotFoundError where none is loaded by that name."""
        with typed_errors():
            self._stub.UnloadLoraAdapter(
                pb.UnloadLoraAdapterRequest(lora_name=name),
                timeout=self._deadline(timeout),
                metadata=self._metadata,
            )

    def close(self) -> None:
        """Close the channel; calls still in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> SluiceClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
