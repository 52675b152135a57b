"""KServeServicer: the v2 RPCs as thin methods over the server's own parts. ModelInfer decodes a batch of
rows and submits each to the model's dynamic batcher; ModelStreamInfer submits each admitted message to
the continuous scheduler and streams its chunks (a tensor model's message gets its one answer), many
messages at once on one stream. Model repository,
statistics, CUDA shared memory, trace and log settings answer UNIMPLEMENTED with a message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from sluice.kserve.v2 import grpc_service_pb2 as v2
from sluice.kserve.v2 import grpc_service_pb2_grpc as v2_grpc

from server.admission.handlers import ADMISSION_WAIT, Context, abort
from server.admission.streams import Admitted, StreamRefusal
from server.errors import ModelNotFound, SluiceError, clip
from server.kserve.calls import V2Call, parameter
from server.kserve.requests import decode_generate_call, decode_infer
from server.kserve.responses import ENABLE_FINAL, encode_chunk, encode_config, encode_infer, encode_metadata
from server.kserve.shm import SharedMemory
from server.servicer import InferenceServicer
from server.submission import call_deadline, chosen_replica, submit_generation

NAME = "sluice"
EXTENSIONS = ("model_configuration", "generate", "binary_tensor_data")
SHM_EXTENSION = "system_shared_memory"  # listed only when --kserve-shm serves it
_STREAM_END = object()
_STREAM_BUFFER = 16  # responses of one ModelStreamInfer waiting for the peer


class KServeServicer(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self, servicer: InferenceServicer, *, ready: Callable[[], bool], version: str, shm: SharedMemory
    ) -> None:
        self.servicer = servicer  # the batchers and schedulers, once installed
        self.ready = ready
        self.version = version
        self.shm = shm

    def _descriptor(self, name: str) -> Any:
        replicas: Any = self.servicer.batchers.get(name) or self.servicer.schedulers.get(name)
        if replicas is None:
            return None
        return replicas[0].model.descriptor

    async def _model(self, name: str, context: Context) -> Any:
        descriptor = self._descriptor(name)
        if descriptor is None:
            error = ModelNotFound(name, sorted(self.servicer.models))
            await abort(context, error)
            raise error
        return descriptor

    async def ServerLive(self, request: v2.ServerLiveRequest, context: Context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: v2.ServerReadyRequest, context: Context) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=self.ready())

    async def ModelReady(self, request: v2.ModelReadyRequest, context: Context) -> v2.ModelReadyResponse:
        return v2.ModelReadyResponse(ready=self.ready() and self._descriptor(request.name) is not None)

    async def ServerMetadata(
        self, request: v2.ServerMetadataRequest, context: Context
    ) -> v2.ServerMetadataResponse:
        extensions = (*EXTENSIONS, SHM_EXTENSION) if self.shm.limits.enabled else EXTENSIONS
        return v2.ServerMetadataResponse(name=NAME, version=self.version, extensions=extensions)

    async def ModelMetadata(
        self, request: v2.ModelMetadataRequest, context: Context
    ) -> v2.ModelMetadataResponse:
        return encode_metadata(await self._model(request.name, context))

    async def ModelConfig(self, request: v2.ModelConfigRequest, context: Context) -> v2.ModelConfigResponse:
        return v2.ModelConfigResponse(config=encode_config(await self._model(request.name, context)))

    async def ModelInfer(self, request: V2Call, context: Context) -> v2.ModelInferResponse:  # type: ignore[override]
        try:
            return await self._infer(request, context)
        except SluiceError as error:
            await abort(context, error)
            raise

    async def _infer(self, request: V2Call, context: Context) -> v2.ModelInferResponse:
        batcher = chosen_replica(self.servicer.batchers, request.model)
        batch = decode_infer(request, batcher.model.descriptor, self.shm.reader(context))
        deadline = call_deadline(context)
        wait = ADMISSION_WAIT.get()
        items = batch.items
        if len(items) == 1:  # the common call: no task per row
            results = [await batcher.submit(items[0], deadline, admission_wait_s=wait)]
        else:
            results = list(
                await asyncio.gather(*(batcher.submit(i, deadline, admission_wait_s=wait) for i in items))
            )
        return encode_infer(request.model, request.request_id, results, batch.requested)

    async def ModelStreamInfer(  # type: ignore[override]
        self, requests: AsyncIterator[Admitted | StreamRefusal], context: Context
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        """Each message is generated in a task of its own; their responses share the one stream, in the
        order they are produced. Leaving the stream (cancelled, or the peer gone) cancels every task, and
        each generation leaves its scheduler at the next step, giving its slot back."""
        # Bounded: a peer that reads slowly holds back its generations (they pause in their own bounded
        # streams, as Generate's do) instead of piling their chunks up here.
        out: asyncio.Queue[Any] = asyncio.Queue(_STREAM_BUFFER)
        tasks: set[asyncio.Task[None]] = set()

        async def feed() -> None:
            try:
                async for item in requests:
                    if isinstance(item, StreamRefusal):
                        await out.put(_error(item.error))
                        continue
                    task = asyncio.create_task(self._generate(item, context, out))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await asyncio.gather(*tasks)
            finally:
                # A full queue is being read: the loop below sees the feeder done once it is empty.
                with contextlib.suppress(asyncio.QueueFull):
                    out.put_nowait(_STREAM_END)

        feeder = asyncio.create_task(feed())
        try:
            while not (feeder.done() and out.empty()):
                message = await out.get()
                if message is _STREAM_END:
                    break
                yield message
            await feeder  # raises what reading the requests raised
        finally:
            for task in (*tasks, feeder):
                task.cancel()
            for task in (*tasks, feeder):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _generate(self, item: Admitted, context: Context, out: asyncio.Queue[Any]) -> None:
        call: V2Call = item.request
        if call.model in self.servicer.batchers:  # a tensor model on a stream: one response, as Triton's
            try:
                answer: v2.ModelStreamInferResponse = v2.ModelStreamInferResponse(
                    infer_response=await self._infer(call, context)
                )
            except SluiceError as error:
                answer = _error(error)
            finally:
                item.slot.release()
            await out.put(answer)
            return
        try:
            spec = decode_generate_call(call)
            submitted = await submit_generation(
                self.servicer.schedulers, spec, context, on_release=item.slot.release
            )
        except SluiceError as error:
            item.slot.release()
            await out.put(_error(error))
            return
        flag = parameter(call.message.parameters, ENABLE_FINAL) is True
        scheduler = submitted.scheduler
        version = scheduler.model.descriptor.version
        # From here on errors arrive as a final chunk with an error, as on Generate.
        async for chunk in scheduler.chunks(submitted.seq):
            await out.put(encode_chunk(spec.model, version, call.request_id, chunk, flag_final=flag))

    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "ModelStatistics: use the Prometheus metrics on --metrics-port")

    async def RepositoryIndex(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "RepositoryIndex: Sluice's models are fixed at start-up (--models)")

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "RepositoryModelLoad: Sluice's models are fixed at start-up (--models)")

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        await _unimplemented(
            context, "RepositoryModelUnload: Sluice's models are fixed at start-up (--models)"
        )

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "CUDA shared memory is not served; use system shared memory")

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "CUDA shared memory is not served; use system shared memory")

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "CUDA shared memory is not served; use system shared memory")

    async def TraceSetting(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "TraceSetting: Sluice writes an access log (--access-log)")

    async def LogSettings(self, request: Any, context: Context) -> Any:
        await _unimplemented(context, "LogSettings: Sluice's logging is set at start-up")

    async def SystemSharedMemoryStatus(
        self, request: v2.SystemSharedMemoryStatusRequest, context: Context
    ) -> v2.SystemSharedMemoryStatusResponse:
        return await self.shm.status(request, context)

    async def SystemSharedMemoryRegister(
        self, request: v2.SystemSharedMemoryRegisterRequest, context: Context
    ) -> v2.SystemSharedMemoryRegisterResponse:
        return await self.shm.register(request, context)

    async def SystemSharedMemoryUnregister(
        self, request: v2.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> v2.SystemSharedMemoryUnregisterResponse:
        return await self.shm.unregister(request, context)


def _error(error: SluiceError) -> v2.ModelStreamInferResponse:
    """A refused or failed message of a stream: Triton's clients raise `error_message` for that request."""
    return v2.ModelStreamInferResponse(
        error_message=f"{error.code} {error.reason}: {clip(error.message, 512)}"
    )


async def _unimplemented(context: Context, message: str) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)
