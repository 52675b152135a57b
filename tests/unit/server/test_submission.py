"""Issue 35, item 5: a Generate is submitted in one place for both APIs (server/submission.py), with real
schedulers over the tiny byte LM: the replica admission chose, NOT_FOUND before anything is queued, the
call's deadline and admission wait, and the request's extras (the tenant's prefix-cache salt) resolved once
and carried by the sequence; the constraint is refused before the model's limits."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import torch

from auth.keys import TenantEntry
from server.admission.devices import CHOSEN
from server.admission.handlers import ADMISSION_WAIT
from server.admission.tenants import CALLER, Tenant
from server.batching.continuous import ContinuousScheduler
from server.batching.extras import RequestExtras
from server.batching.requests import RequestLimits
from server.batching.worker import ModelWorker
from server.domain import GenerateSpec, Priority
from server.errors import LimitExceeded, ModelNotFound
from server.logits.grammar import MAX_CONSTRAINT_CHARS
from server.metrics import Metrics
from server.runtimes.byte_lm import ByteLm
from server.submission import Submitted, submit_generation
from wire.constraint import Constraint
from wire.sampling import Sampling

MODEL = "byte-lm"


class Deadline:
    """The servicer context as submission reads it: the call's time left."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


@pytest.fixture
def replicas() -> Iterator[list[ContinuousScheduler]]:
    """Two replicas of one model, as --devices makes them (their loops never run: nothing is generated)."""
    workers = [ModelWorker(f"test-{i}") for i in range(2)]
    yield [
        ContinuousScheduler(
            ByteLm(size="tiny", context_length=128, max_sequences=4, device=torch.device("cpu")),
            worker,
            kv_tokens=256,
            limits=RequestLimits(context_length=128, default_max_tokens=16),
            stream_buffer=16,
            stall_timeout_s=30.0,
            breaker=None,
            metrics=Metrics(),
        )
        for worker in workers
    ]
    for worker in workers:
        worker.shutdown()


def spec(prompt: str = "hello", **kw: Any) -> GenerateSpec:
    return GenerateSpec(model=MODEL, prompt_text=prompt, prompt_ids=None, sampling=Sampling.of({}), **kw)


def as_call(
    body: Callable[[], Awaitable[None]], *, device: int, caller: Tenant | None, waited: float
) -> None:
    """Runs `body` as admission leaves a call: on a device, for a tenant, after a wait for its slot."""

    async def call() -> None:
        CHOSEN.set(device)
        CALLER.set(caller)
        ADMISSION_WAIT.set(waited)
        await body()

    asyncio.run(call())


def tenant(name: str, salt: str) -> Tenant:
    entry = TenantEntry(name, b"", "normal", 1.0, 1.0, None, cache_salt=salt)
    return Tenant(entry=entry, priority_ceiling=Priority.NORMAL)


def test_a_generation_joins_the_chosen_replica_with_its_tenants_salt(
    replicas: list[ContinuousScheduler],
) -> None:
    caller = tenant("acme", "group:team")
    released: list[str] = []
    got: list[Submitted] = []

    async def body() -> None:
        before = time.monotonic()
        submitted = await submit_generation(
            {MODEL: replicas}, spec(), Deadline(5.0), on_release=lambda: released.append("slot")
        )
        assert before + 5.0 <= submitted.seq.deadline <= time.monotonic() + 5.0
        got.append(submitted)

    as_call(body, device=1, caller=caller, waited=0.25)
    submitted = got[0]
    assert submitted.scheduler is replicas[1] and submitted.tenant is caller
    assert list(replicas[1].joining) == [submitted.seq] and not replicas[0].joining
    assert submitted.seq.extras == RequestExtras(salt="group:team")
    assert submitted.seq.admission_wait_s == 0.25
    replicas[1].cancel(submitted.seq)  # it never joined: its slot is given back at once
    assert released == ["slot"]


def test_a_call_without_a_tenant_or_deadline_shares_the_unsalted_cache(
    replicas: list[ContinuousScheduler],
) -> None:
    got: list[Submitted] = []

    async def body() -> None:
        got.append(await submit_generation({MODEL: replicas}, spec(), Deadline(None), on_release=None))

    as_call(body, device=0, caller=None, waited=0.0)
    assert got[0].scheduler is replicas[0] and got[0].tenant is None
    assert got[0].seq.extras == RequestExtras(salt="") and got[0].seq.deadline == math.inf


def test_a_model_not_served_is_not_found_before_anything_is_queued(
    replicas: list[ContinuousScheduler],
) -> None:
    released: list[str] = []

    async def body() -> None:
        with pytest.raises(ModelNotFound) as caught:
            await submit_generation(
                {MODEL: replicas},
                GenerateSpec(model="absent", prompt_text="x", prompt_ids=None),
                Deadline(5.0),
                on_release=lambda: released.append("slot"),
            )
        assert caught.value.reason == "MODEL_NOT_FOUND" and MODEL in caught.value.message

    as_call(body, device=0, caller=None, waited=0.0)
    assert not any(r.joining for r in replicas) and not released


def test_the_constraint_is_refused_before_the_models_limits(replicas: list[ContinuousScheduler]) -> None:
    """Both limits are broken; the constraint's size is checked first, as Generate always has."""
    oversize = spec("x" * 200, constraint=Constraint.regex("a" * (MAX_CONSTRAINT_CHARS + 1)))

    async def body() -> None:
        with pytest.raises(LimitExceeded) as caught:
            await submit_generation({MODEL: replicas}, oversize, Deadline(None), on_release=None)
        assert caught.value.field == "constraint.regex"
        with pytest.raises(LimitExceeded) as caught:  # the prompt alone: the model's context
            await submit_generation({MODEL: replicas}, spec("x" * 200), Deadline(None), on_release=None)
        assert caught.value.field == "text"

    as_call(body, device=0, caller=None, waited=0.0)
    assert not any(r.joining for r in replicas)
