"""Adapters: the LoRA adapters this server serves, each under a model name of its own over a base model
(vLLM's --lora-modules and its load/unload routes). Loading reads and checks the PEFT directory on a thread
(server/runtimes/lora.py), beside the running steps, then publishes the adapter in one place the request
path reads: each replica's `adapters` table (server/submission.py resolves a model name there into the
request's extras), the servicer's model list (ListModels shows `parent`) and routing, and admission's gates
(an adapter's calls queue on its base model's gate, under its own name in metrics and tenants' lists)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from server.errors import InvalidArgument, LimitExceeded, ModelNotFound, PermissionDenied, SluiceError, clip
from server.lora_metrics import register
from server.runtimes.lora import AdapterError, LoraAdapter, LoraLimits

if TYPE_CHECKING:
    from sluice.inference.v1 import inference_pb2 as pb

    from server.admission.interceptor import AdmissionInterceptor
    from server.admission.tenants import Tenant
    from server.batching.continuous import ContinuousScheduler
    from server.lora_flags import LoraFlags
    from server.metrics import Metrics


_NAME = re.compile(r"[A-Za-z0-9._/:@-]{1,128}")


class Served(Protocol):
    """What of the servicer (server/servicer.py) adapters are published in: its models and their routes."""

    @property
    def batchers(self) -> Mapping[str, object]: ...

    schedulers: dict[str, list[ContinuousScheduler]]
    models: dict[str, pb.ModelInfo]


def check_admin(tenant: Tenant | None) -> None:
    """With a keys file, only an entry marked `admin = true` may load or unload adapters."""
    if tenant is not None and not tenant.entry.admin:
        raise PermissionDenied(
            f"tenant {tenant.name!r} may not load or unload LoRA adapters (its keys-file entry needs admin = "
            "true)",
            metadata={"tenant": tenant.name},
        )


class Adapters:
    def __init__(self, servicer: Served, interceptor: AdmissionInterceptor, limits: LoraLimits) -> None:
        self.servicer, self.interceptor, self.limits = servicer, interceptor, limits
        self.bases: dict[str, str] = {}  # adapter name -> base model name
        self._lock = asyncio.Lock()  # one load or unload at a time: names and counts stay consistent

    @classmethod
    async def serve(
        cls, servicer: Served, interceptor: AdmissionInterceptor, settings: LoraFlags, metrics: Metrics | None
    ) -> Adapters:
        """The server's adapters, --lora-modules loaded (ValueError naming the setting where one cannot)."""
        from server.lora_flags import parse_lora_modules

        adapters = cls(servicer, interceptor, settings.lora_limits)
        if metrics is not None:
            register(metrics.registry, lambda: servicer.schedulers, settings.max_loras)
        for name, path in parse_lora_modules(settings.lora_modules):
            try:
                await adapters.load(name, path)
            except SluiceError as error:
                raise ValueError(f"invalid setting lora_modules: {name}: {error.message}") from None
        return adapters

    async def load(self, name: str, path: str, base: str = "") -> LoraAdapter:
        """Reads, checks and serves the adapter at `path` as model `name`; SluiceError where it cannot."""
        async with self._lock:
            if not _NAME.fullmatch(name):  # a model name and a metric label's list item: no commas, no spaces
                raise InvalidArgument(
                    f"lora_name {clip(name)!r} must be 1-128 letters, digits and . _ - / : @",
                    field="lora_name",
                )
            if name in self.servicer.models or name in self.servicer.batchers:
                raise InvalidArgument(f"model {name!r} is already served; unload it first", field="lora_name")
            if len(self.bases) >= self.limits.max_loras:
                raise LimitExceeded(
                    f"{len(self.bases)} LoRA adapters are loaded, --max-loras {self.limits.max_loras}; "
                    "unload one first",
                    field="lora_name",
                )
            base = base or self._only_base()
            replicas = self.servicer.schedulers.get(base)
            if replicas is None or base in self.bases:
                raise ModelNotFound(base, [b for b in self.servicer.schedulers if b not in self.bases])
            try:
                read = [
                    await asyncio.to_thread(s.model.read_adapter, name, Path(path), self.limits)
                    for s in replicas
                ]
            except AdapterError as exc:
                raise InvalidArgument(clip(str(exc), 1000), field="lora_path") from None
            except Exception as exc:  # a file that parses but holds what torch cannot take: still a refusal
                why = f"{type(exc).__name__}: {clip(str(exc))}"
                raise InvalidArgument(
                    f"{clip(path)}: the adapter could not be read ({why})", field="lora_path"
                ) from None
            for scheduler, adapter in zip(replicas, read, strict=True):
                scheduler.model.adapters = MappingProxyType({**scheduler.model.adapters, name: adapter})
                await asyncio.to_thread(scheduler.model.adapters_changed)
            self.bases[name] = base
            self.servicer.schedulers[name] = replicas
            info = type(self.servicer.models[base])()
            info.CopyFrom(self.servicer.models[base])
            info.name, info.parent, info.lora_rank = name, base, read[0].rank
            info.description = f"LoRA adapter of {base}, rank {read[0].rank}: {', '.join(read[0].targets)}"
            self.servicer.models = dict(sorted({**self.servicer.models, name: info}.items()))
            for method in self.interceptor.methods.values():
                if base in method.gates:
                    method.gates[name] = method.gates[base]
            return read[0]

    async def unload(self, name: str) -> None:
        """Stops serving adapter `name` (NOT_FOUND naming it where none is loaded by that name); sequences
        already running keep its weights until they end."""
        async with self._lock:
            base = self.bases.pop(name, None)
            if base is None:
                raise ModelNotFound(name, sorted(self.bases))
            for method in self.interceptor.methods.values():
                method.gates.pop(name, None)
            self.servicer.models = {n: m for n, m in self.servicer.models.items() if n != name}
            for scheduler in self.servicer.schedulers.pop(name):
                rest = {n: a for n, a in scheduler.model.adapters.items() if n != name}
                scheduler.model.adapters = MappingProxyType(rest)
                await asyncio.to_thread(scheduler.model.adapters_changed)

    def _only_base(self) -> str:
        generative = [name for name in self.servicer.schedulers if name not in self.bases]
        if len(generative) != 1:
            raise InvalidArgument(
                f"name the base model (base_model_name): this server serves {sorted(generative)}",
                field="base_model_name",
            )
        return generative[0]
