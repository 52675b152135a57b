"""InferenceServicer: thin RPC methods (decode -> submit or tokenize -> encode); admission happened in the
interceptor."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
from sluice.inference.v1 import inference_pb2 as pb
from sluice.inference.v1 import inference_pb2_grpc as pb_grpc

from server.adapters import Adapters, check_admin
from server.admission.handlers import ADMISSION_WAIT, STREAM_SLOT, abort
from server.admission.tenants import CALLER
from server.batching.continuous import ContinuousScheduler
from server.batching.dynamic import DynamicBatcher
from server.codec.messages import decode_generate, decode_infer, encode_chunk, encode_infer, encode_model
from server.codec.tokens import decode_detokenize, decode_tokenize, encode_detokenize, encode_tokenize
from server.domain import ModelDescriptor, Usage
from server.errors import InvalidArgument, ModelNotFound, NotReady, SluiceError
from server.metrics import Metrics
from server.submission import call_deadline, chosen_replica, detokenize, submit_generation, tokenize

Context = grpc.aio.ServicerContext[Any, Any]


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics  # tokens in and out by tenant and model (None: not counted)
        # A model's replicas, one per device, in the order of DeviceGates' gates (admission picks one).
        self.batchers: dict[str, list[DynamicBatcher]] = {}
        self.schedulers: dict[str, list[ContinuousScheduler]] = {}
        self.models: dict[str, pb.ModelInfo] = {}
        self.adapters: Adapters | None = None  # the LoRA adapters' loading and unloading (server/app.py)

    def install(
        self,
        batchers: Mapping[str, Sequence[DynamicBatcher]],
        schedulers: Mapping[str, Sequence[ContinuousScheduler]],
    ) -> None:
        """Called once the models are loaded; until then the interceptor refuses with NOT_READY."""
        self.batchers = {name: list(replicas) for name, replicas in batchers.items()}
        self.schedulers = {name: list(replicas) for name, replicas in schedulers.items()}
        descriptors: list[ModelDescriptor] = [b[0].model.descriptor for b in self.batchers.values()]
        descriptors += [s[0].model.descriptor for s in self.schedulers.values()]
        self.models = {d.name: encode_model(d) for d in sorted(descriptors, key=lambda d: d.name)}

    async def Infer(self, request: pb.InferRequest, context: Context) -> pb.InferResponse:
        try:
            item = decode_infer(request)
            batcher = chosen_replica(self.batchers, item.model)
            batcher.model.validate(item.inputs)
            deadline = call_deadline(context)
            result = await batcher.enqueue(item, deadline, admission_wait_s=ADMISSION_WAIT.get())
            return encode_infer(item.model, item.request_id, result, typed=item.typed_outputs)
        except SluiceError as error:
            await abort(context, error)
            raise

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            spec = decode_generate(request)
            slot = STREAM_SLOT.get()
            on_release = slot.release if slot is not None else None
            submitted = await submit_generation(self.schedulers, spec, context, on_release=on_release)
        except SluiceError as error:
            await abort(context, error)
            raise
        # From here on errors arrive as a final message with a finish reason, never as a silent cut.
        seq, tenant = submitted.seq, submitted.tenant
        try:
            async for chunk in submitted.scheduler.chunks(seq):
                yield encode_chunk(chunk)
        finally:  # a caller that left is billed for what was generated for it
            if self.metrics is not None:
                self._count(tenant.name if tenant is not None else "", spec.model, seq.usage())

    async def Tokenize(self, request: pb.TokenizeRequest, context: Context) -> pb.TokenizeResponse:
        try:
            spec = decode_tokenize(request)
            scheduler = chosen_replica(self.schedulers, spec.model)
            token_ids = tokenize(scheduler.model, spec)
        except SluiceError as error:
            await abort(context, error)
            raise
        return encode_tokenize(request, token_ids, context_length=scheduler.limits.context_length)

    async def Detokenize(self, request: pb.DetokenizeRequest, context: Context) -> pb.DetokenizeResponse:
        try:
            model, token_ids = decode_detokenize(request)
            text = detokenize(chosen_replica(self.schedulers, model).model, token_ids)
        except SluiceError as error:
            await abort(context, error)
            raise
        return encode_detokenize(request, text)

    def _count(self, tenant: str, model: str, usage: Usage) -> None:
        m = self.metrics
        assert m is not None
        m.prompt_tokens.labels(tenant, model).inc(usage.prompt_tokens)
        m.completion_tokens.labels(tenant, model).inc(usage.completion_tokens)
        if usage.cached_tokens:
            m.cached_prompt_tokens.labels(tenant, model).inc(usage.cached_tokens)

    async def ListModels(self, request: pb.ListModelsRequest, context: Context) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=list(self.models.values()))

    async def GetModel(self, request: pb.GetModelRequest, context: Context) -> pb.GetModelResponse:
        info = self.models.get(request.name)
        if info is None:
            error: SluiceError = (
                InvalidArgument("name must be set", field="name")
                if not request.name
                else ModelNotFound(request.name, list(self.models))
            )
            await abort(context, error)
            raise error
        return pb.GetModelResponse(model=info)

    async def LoadLoraAdapter(
        self, request: pb.LoadLoraAdapterRequest, context: Context
    ) -> pb.LoadLoraAdapterResponse:
        try:
            check_admin(CALLER.get())
            if self.adapters is None:
                raise NotReady("the models are not loaded yet")
            await self.adapters.load(request.lora_name, request.lora_path, request.base_model_name)
        except SluiceError as error:
            await abort(context, error)
            raise
        return pb.LoadLoraAdapterResponse(model=self.models[request.lora_name])

    async def UnloadLoraAdapter(
        self, request: pb.UnloadLoraAdapterRequest, context: Context
    ) -> pb.UnloadLoraAdapterResponse:
        try:
            check_admin(CALLER.get())
            if self.adapters is None:
                raise NotReady("the models are not loaded yet")
            await self.adapters.unload(request.lora_name)
        except SluiceError as error:
            await abort(context, error)
            raise
        return pb.UnloadLoraAdapterResponse()
