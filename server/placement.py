"""Placement: one replica of every model on one device (`--devices`: one each), with what that replica owns
alone: its memory breaker, its model threads, its batchers and schedulers, and its admission gates sized
by what that device's memory allows. The server starts one DevicePlacement per device."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from server.admission.gate import AdmissionGate
from server.batching.continuous import ContinuousScheduler
from server.batching.dynamic import DynamicBatcher
from server.batching.requests import RequestLimits
from server.batching.worker import ModelWorker
from server.config import Settings
from server.domain import GenerateSpec
from server.errors import SluiceError
from server.kv.arena import ALIGN
from server.kv.prefix import PrefixEvents
from server.memory.breaker import MemoryBreaker
from server.memory.capacity import kv_tokens, plan_capacity
from server.memory.probes import make_probe
from server.metrics import Metrics
from server.runtimes.base import GenerativeModel, Prefill, TensorModel
from server.runtimes.registry import build_models

log = logging.getLogger(__name__)
# The batch a CPU warm-up fills at most: 256 rows of SmolLM2 (30 layers) took 6.2 s of a 2-core machine's
# start, 32 take 0.7 s; a CPU batch seldom grows past that, and a larger one pays its growth once.
CPU_WARM_ROWS = 32
# What a Generate scheduler asks of admission once a prompt is tokenized: (model, spec, tokens) -> refusal.
PromptCheck = Callable[[str, GenerateSpec, int], SluiceError | None]


@dataclass
class DevicePlacement:
    device: torch.device
    breaker: MemoryBreaker
    label: str  # the device in metrics: `cuda:1`, or `cpu#1` where a device is named twice
    workers: list[ModelWorker] = field(default_factory=list)
    batchers: dict[str, DynamicBatcher] = field(default_factory=dict)
    schedulers: dict[str, ContinuousScheduler] = field(default_factory=dict)
    # One gate per model, as Triton has a queue per model: one model's load never takes another's slots.
    infer_gates: dict[str, AdmissionGate] = field(default_factory=dict)
    generate_gates: dict[str, AdmissionGate] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def breaker_for(settings: Settings, device: torch.device, index: int, count: int) -> MemoryBreaker:
    """The memory breaker of device `index` of `count`; with several devices a fake probe reads
    `PATH.index`, so a test can push one device over its watermark alone."""
    budget = settings.memory_budget_mb * 1024 * 1024
    spec = settings.memory_probe
    if count > 1 and spec.startswith("fake:"):
        spec = f"{spec}.{index}"
    return MemoryBreaker(
        make_probe(spec, device, budget),
        high=settings.high_watermark,
        low=settings.low_watermark,
        interval_s=settings.probe_interval_s,
    )


async def place(
    settings: Settings,
    placement: DevicePlacement,
    metrics: Metrics,
    *,
    prompt_check: PromptCheck | None = None,
) -> None:
    """Loads, sizes and warms every model on the placement's device and starts its batchers; a Generate
    scheduler runs `prompt_check` (admission's, server/admission/policy.py) on each tokenized prompt."""
    placement.tasks.append(asyncio.create_task(placement.breaker.run(), name=f"breaker-{placement.device}"))
    models = await asyncio.to_thread(build_models, settings, placement.device)
    for model in models:
        name = model.descriptor.name
        worker = ModelWorker(name)
        placement.workers.append(worker)
        if isinstance(model, TensorModel):
            placement.batchers[name], slots = await _start_tensor_model(
                settings, placement, model, worker, metrics
            )
            placement.infer_gates[name] = AdmissionGate(
                f"Infer {name}", slots=slots, max_waiting=settings.max_queue
            )
        else:
            scheduler = await _start_generative_model(
                settings, placement, model, worker, metrics, prompt_check
            )
            placement.schedulers[name] = scheduler
            placement.generate_gates[name] = AdmissionGate(
                f"Generate {name}",
                slots=settings.max_sequences,
                max_waiting=settings.max_queue,
                service_of=scheduler.service_estimate_s,
            )


async def _start_tensor_model(
    settings: Settings, placement: DevicePlacement, model: TensorModel, worker: ModelWorker, metrics: Metrics
) -> tuple[DynamicBatcher, int]:
    """The model's batcher, and its admission slots (--max-concurrency, else what memory allows)."""
    plan = await worker.run(plan_capacity, model, settings, placement.breaker.probe)
    log.info("capacity for %s on %s: %s", model.descriptor.name, placement.device, plan.explain())
    await worker.run(model.warmup, settings.warmup_steps)
    batcher = DynamicBatcher(
        model,
        worker,
        max_batch_size=min(settings.max_batch_size, plan.max_batch_size),
        max_delay_s=settings.max_delay_ms / 1000,
        breaker=placement.breaker,
        metrics=metrics,
        device_label=placement.label,
        switch_interval_s=settings.infer_switch_interval_ms / 1000,
    )
    placement.tasks.append(asyncio.create_task(batcher.run(), name=f"batcher-{model.descriptor.name}"))
    return batcher, settings.max_concurrency or plan.max_concurrency


async def _start_generative_model(
    s: Settings,
    placement: DevicePlacement,
    model: GenerativeModel,
    worker: ModelWorker,
    metrics: Metrics,
    prompt_check: PromptCheck | None,
) -> ContinuousScheduler:
    context = model.descriptor.limits.context_length
    tokens, why = kv_tokens(model, s, context, placement.breaker.probe.read())
    cache = await worker.run(model.allocate_cache, tokens)
    if s.kv_cache_prefault:
        await worker.run(model.kv.prefault)
    log.info(
        "KV cache for %s on %s: %d tokens = %.1f MiB (%s), sequences up to %d tokens, prefix cache %s",
        model.descriptor.name,
        placement.device,
        tokens,
        cache / 2**20,
        why,
        context,
        "on" if s.prefix_cache else "off",
    )
    scheduler = ContinuousScheduler(
        model,
        worker,
        kv_tokens=tokens,
        prefix_cache=s.prefix_cache,
        prefix_sharing=s.prefix_sharing,
        prefill_chunk_tokens=s.prefill_chunk_tokens or (512 if model.device.type == "cuda" else 32),
        limits=RequestLimits(
            context_length=context,
            default_max_tokens=s.default_max_tokens,
            max_stop_sequences=s.max_stop_sequences,
            max_stop_chars=s.max_stop_chars,
        ),
        stream_buffer=s.stream_buffer,
        stall_timeout_s=s.stall_timeout_s,
        breaker=placement.breaker,
        metrics=metrics,
        device_label=placement.label,
        prompt_check=prompt_check,
        kv_events=_kv_events(s, model),
    )
    rows = min(
        s.max_sequences, tokens // ALIGN, CPU_WARM_ROWS if model.device.type == "cpu" else s.max_sequences
    )
    await worker.run(_warm_generative, model, s.warmup_steps, rows)
    placement.tasks.append(asyncio.create_task(scheduler.run(), name=f"scheduler-{model.descriptor.name}"))
    return scheduler


def _kv_events(s: Settings, model: GenerativeModel) -> PrefixEvents | None:
    if s.kv_events_endpoint is None:
        return None
    from server.kv.events import publisher

    events = publisher(s.kv_events_endpoint, s.kv_events_replay_endpoint)
    return events.sink(model.descriptor.name, model.device.type)


def _warm_generative(model: GenerativeModel, steps: int, rows: int) -> None:
    """Runs prefill and decode once alone and once with a full batch, so the first real requests do not pay
    for lazy initialisation and the allocator's high-water mark is reached before serving (a full first
    batch grew the server's RSS by up to ~50 MB in the slow-client storm otherwise). What it writes into
    the arena is never read: regions are written before they are attended."""
    for _ in range(steps):
        for batch in sorted({1, rows}):
            bases = [row * ALIGN for row in range(batch)]
            logits = model.prefill_many([Prefill(base, [1, 2, 3, 4]) for base in bases])
            tokens = logits.argmax(dim=-1)
            model.decode(bases, tokens, torch.full((batch,), 4, device=model.device))
