"""The blocking client: `SluiceClient` and the `GenerationStream` its `generate` returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from clients.channel import ChannelSettings, check_timeout, open_channel
from clients.codec import InputValue
from clients.errors import error_from_rpc, typed_errors
from clients.messages import (
    build_generate_request,
    build_infer_request,
    chunk_from_response,
    model_info_from_proto,
    result_from_response,
)
from clients.types import ChatMessage, GenerationChunk, InferResult, ModelInfo, ParameterScalar, PriorityName
from wire.metadata import AUTHORIZATION

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


class SluiceClient:
    """A blocking client of one Sluice server; safe to share between threads.

    `timeout` is the default deadline, in seconds, of every call (None: no deadline); each method's
    `timeout` argument overrides it for that call.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 30.0,
        settings: ChannelSettings | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        self._timeout = check_timeout(timeout)
        # A server started with --auth-keys wants it on every call (as `authorization: Bearer`).
        self._metadata = ((AUTHORIZATION, f"Bearer {token}"),) if token is not None else None
        self._channel = open_channel(target, settings or ChannelSettings(), credentials)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)

    def _deadline(self, timeout: float | None) -> float | None:
        return self._timeout if timeout is None else check_timeout(timeout)

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
        request = build_infer_request(
            model, inputs, priority=priority, request_id=request_id, parameters=parameters
        )
        with typed_errors():
            response = self._stub.Infer(request, timeout=self._deadline(timeout), metadata=self._metadata)
        return result_from_response(response)

    def generate(
        self,
        model: str,
        prompt: str | Sequence[int] | Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        min_tokens: int | None = None,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        priority: PriorityName | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> GenerationStream:
        """Start a generation; iterate the returned stream for its chunks (errors surface while iterating)."""
        request = build_generate_request(
            model,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=stop,
            priority=priority,
            request_id=request_id,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            logprobs=logprobs,
        )
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

    def close(self) -> None:
        """Close the channel; calls still in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> SluiceClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
